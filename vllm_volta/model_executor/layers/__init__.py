"""vLLM's layer vocabulary: linear.py, layernorm.py (RMSNorm), activation.py (SiluAndMul),
rotary_embedding.py (get_rope), vocab_parallel_embedding.py, logits.py, parallel_state.py.

Import the module you need; nothing is re-exported here, so using a plain-torch layer does not
load the compiled ops (vllm_volta._C) that RMSNorm and SiluAndMul call."""
