"""What seekrl's HTTP endpoints share, below every layer that serves one: the request policy
(`guards.py`: bearer token, bounded JSON bodies, counters), OpenAI's chat / completions wire
format (`openai_wire.py`), and on the client side one httpx client per event loop (`http.py`:
the retriever, web tools and judge clients). The public servers (seekrl/servers/) and the per-episode endpoint that
agents written against the OpenAI API talk to during rollout (seekrl/workflows/agent_endpoint.py)
both build on them."""
