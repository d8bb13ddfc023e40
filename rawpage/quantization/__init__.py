"""Quantized Linear weights: the formats rawpage keeps quantized on the device.

A Linear layer's weight is either a dense array (out, in) or a QuantizedWeight
(weight.py). Models never look inside: they call `backend.linear(x, w, bias)`,
and the backend picks the kernel from `w.kind` (see Backend.linear).
"""
