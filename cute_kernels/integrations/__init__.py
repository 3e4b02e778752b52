"""Backends for other libraries, each in its own module and imported only when asked for
(importing this package imports neither torch nor the libraries):

- `integrations.transformers`: registers the "cute_kernels" attention implementation with
  Hugging Face transformers' `AttentionInterface` and its mask hook with
  `AttentionMaskInterface`, so `from_pretrained(..., attn_implementation="cute_kernels")` and
  `model.set_attn_implementation("cute_kernels")` run attention on our kernels.
  `hf_masks` reads the mask transformers describes into what our kernels take.
- `integrations.timm`: routes timm models' attention (their modules' own
  `F.scaled_dot_product_attention` calls) to ours, module by module.

`cute_kernels.nn.patch(model)` picks the right one for a model.
"""
