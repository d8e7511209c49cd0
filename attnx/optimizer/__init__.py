"""``attnx optimize``: a new export whose graphs are block-quantised (int4/int8 weights, per layer kind),
int8-quantised dynamically, converted to fp16, slimmed or fused, gated on text (a language model) or on
a stated error bound against the float32 torch model (:func:`attnx.optimizer.optimize.optimize`)."""
