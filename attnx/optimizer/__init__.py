"""``attnx optimize``: a new export whose graphs are slimmed, int8-quantised or converted to fp16, held
to a stated error bound against the float32 torch model (:func:`attnx.optimizer.optimize.optimize`)."""
