"""Running models: the model runner, the paged KV cache, step metadata, host-device
transfers, CUDA graphs."""
