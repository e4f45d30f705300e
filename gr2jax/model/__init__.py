"""The Qwen3 core: config, params, masks, KV cache, forward, AR decoding, sharding."""
