"""OpenAI legacy Completions: POST /v1/completions (raw prompt, no chat template)."""
