"""Old home of the policy server; it lives in seekrl/servers/policy.py now.

Kept so `from seekrl.serve_policy import make_app` and `python -m seekrl.serve_policy` still work.
"""

from __future__ import annotations

from seekrl.servers.policy import TOKEN_ENV, ChatRequest, CompletionRequest, main, make_app, serve_policy

__all__ = ["make_app", "serve_policy", "main", "TOKEN_ENV", "ChatRequest", "CompletionRequest"]

if __name__ == "__main__":
    main()
