"""Llama: llama-cpp-python's constructor over tokenloop.Model, so that code
written for `llama_cpp.Llama(model_path=..., n_ctx=..., n_threads=...)` runs
with the import changed. Its GPU, mmap and logging options mean nothing here
and are accepted and ignored; anything else is an error."""
from .model import Model

_IGNORED = {"n_gpu_layers", "main_gpu", "tensor_split", "split_mode", "use_mmap", "use_mlock", "vocab_only",
            "offload_kqv", "flash_attn", "verbose", "logits_all", "embedding", "last_n_tokens_size",
            "n_threads_batch", "rope_scaling_type", "rope_freq_base", "rope_freq_scale", "chat_format",
            "chat_handler", "numa", "kv_overrides", "rpc_servers", "lora_path", "lora_base", "n_ubatch",
            "pooling_type", "draft_model", "tokenizer", "spm_infill", "type_k", "type_v"}


class Llama(Model):
    def __init__(self, model_path, n_ctx=512, n_threads=None, n_batch=512, seed=None, **kwargs):
        unknown = set(kwargs) - _IGNORED - {"numerics", "spec", "draft", "chat_template", "kv_type_k",
                                            "kv_type_v"}
        if unknown:
            raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
        own = {k: v for k, v in kwargs.items() if k not in _IGNORED}
        super().__init__(model_path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, **own)
        self.model_path = model_path
        if seed is not None and 0 <= seed < 0xFFFFFFFF:  # llama.cpp's 0xFFFFFFFF: random
            self.default_seed = seed
