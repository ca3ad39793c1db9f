"""An agent written against the OpenAI API with the stock `openai` client, and nothing from seekrl.

seekrl trains it as it is (`rollout.agent=examples.openai_agent.agent:run`): every episode calls
`run(task, base_url, api_key, **rollout.agent_kwargs)` with its own endpoint, and every token
the model samples through it is recorded and trained.

- `run`: one chat call on the task's messages; the reply is the answer (tiny.yaml, tiny:copy).
- `search_agent`: a Search-R1-style search loop (demo_search.yaml): the model writes
  `<search>query</search>`, the agent asks a Search-R1 `/retrieve` server and appends
  `<information>...</information>` to the assistant message, which the model continues
  (vLLM's `continue_final_message`), until it writes `<answer>...</answer>`.
"""

from __future__ import annotations

import json
import re
import urllib.request

from openai import DefaultHttpxClient, OpenAI

SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
HTTP = DefaultHttpxClient()  # one connection pool for every episode: a client of its own costs ~20 ms to make


def client_for(base_url: str, api_key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=HTTP)


def run(task, base_url, api_key, **_):
    client = client_for(base_url, api_key)
    reply = client.chat.completions.create(model="policy", messages=task["messages"])
    return reply.choices[0].message.content


def retrieve(url: str, query: str, topk: int, token: str | None = None) -> str:
    """Search-R1's POST /retrieve -> its passage text: `Doc i(Title: t) text` lines, as Search-R1 writes them."""
    body = json.dumps({"queries": [query], "topk": topk, "return_scores": False}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30) as r:
        docs = json.load(r)["result"][0]
    lines = []
    for i, d in enumerate(docs):
        d = d.get("document", d) if isinstance(d, dict) else {"contents": str(d)}
        title, _, text = d.get("contents", "").partition("\n")
        lines.append(f"Doc {i + 1}(Title: {title}) {text}")
    return "\n".join(lines)


def search_agent(task, base_url, api_key, retriever_url, topk=3, max_turns=4, token=None, **_):
    client = client_for(base_url, api_key)
    so_far = ""  # the assistant message: the model's turns and the inserted search results
    for turn in range(max_turns + 1):
        messages = task["messages"] + ([{"role": "assistant", "content": so_far}] if so_far else [])
        extra = {"continue_final_message": True, "add_generation_prompt": False} if so_far else {}
        reply = client.chat.completions.create(
            model="policy", messages=messages, stop=["</search>", "</answer>"] if turn < max_turns else ["</answer>"],
            extra_body={**extra, "include_stop_str_in_output": True},
        )
        text = reply.choices[0].message.content
        so_far += text
        found = SEARCH.search(text)
        if "</answer>" in text or found is None or turn == max_turns:
            break
        so_far += f"\n\n<information>{retrieve(retriever_url, found.group(1).strip(), topk, token)}</information>\n\n"
    return so_far
