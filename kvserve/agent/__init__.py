"""`kvserve agent`: a terminal coding agent that talks to a kvserve (or any OpenAI/Anthropic) server
over HTTP and runs its tools locally, confined to a working directory."""
