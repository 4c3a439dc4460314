"""The engine: EngineArgs -> LLMEngine (sync, step-driven); AsyncLLM for the server."""
