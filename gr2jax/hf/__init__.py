"""HF Qwen3 directories: the declarative param table, safetensors I/O and the weight reader.

The library's own HF support (`gr2jax.load.load_model` reads HF directories with it);
weights_conversion/ (the convert / export CLIs) imports it, never the other way round.
"""
