"""The LLM adapter: the one place Chorus talks to litellm, plus a scripted model."""
