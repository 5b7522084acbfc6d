"""Full-vocabulary float64 scoring of candidate logits against the teacher's (docs/score.md, docs/formats-records.md).

``metrics`` defines the figures and the check metric; ``reference`` (numpy, the CPU check),
``torch_kernel`` (fallback) and ``triton_kernel`` (GPU, one streaming kernel) compute them; ``records`` writes the Parquet file;
``run`` drives a whole run. Imports only torch/numpy (triton optional) so it runs on the GPU machine.
"""
