"""Weight sources: where a run's tensors come from, one layer at a time, under the reference's Hugging Face names.

* :mod:`.checkpoint` -- safetensors checkpoints (the reference, headers bounded before any allocation);
* :mod:`.fp8_release` -- FP8 releases as the teacher (scales checked, dequantized on the device);
* :mod:`.quantized` -- real quantized builds (safetensors formats, GGUF) presented under HF names;
* :mod:`.gguf_checkpoint`, :mod:`.gguf_meta` -- a GGUF file's tensors and model metadata.
"""
