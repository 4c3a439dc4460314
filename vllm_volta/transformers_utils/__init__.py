"""transformers-facing helpers: model source/config resolution (config.py), tokenizers
(tokenizer.py, gguf_tokenizer.py) and the default model (default_model.py)."""
