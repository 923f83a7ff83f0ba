"""What kvtier's tests, examples and benchmarks share, kept out of the product package:
``daemon`` (a kvtierd of one's own), ``vllm_harness`` (vLLM's call order without vLLM, for
the reference engine), ``torch_engine`` (a small transformer that shows reuse is exact),
``bench`` (the binding against the C++ client), ``tiny_model`` (a local random-weight
Llama and tokenizer), ``vllm_e2e`` (real ``vllm serve`` processes with and without
kvtier)."""
