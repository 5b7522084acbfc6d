"""What the layer-major runners do to a unit while it runs, beside the outer loop (fideval.model.layer_major):

* :mod:`.hooks` -- activation transforms, the routed experts' wrapper, the canary;
* :mod:`.head` -- the lm head's arithmetic (float32, or bf16 products with float32 sums where exact);
* :mod:`.experts` -- routed experts bit-identical to transformers' grouped_mm path, with less memory traffic;
* :mod:`.throughput` -- the MLP over token blocks spanning micro-batches;
* :mod:`.parallel` -- model parallel over torchrun ranks (experts, lm head);
* :mod:`.prefetch` -- the next unit loaded on a background thread, and the ledger of resident weights;
* :mod:`.determinism` -- TF32 off, deterministic algorithms, logit digests.
"""
