"""User entry points: the offline LLM class, the CLI and the OpenAI-compatible server."""
