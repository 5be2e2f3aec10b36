"""The `onnxruntime` target: its dialect (`ort.*`), SMT meaning, lowering passes, serializers,
runners (single and batched) and llmir's native kernels (`native/`). Registered in the target
table (llmir_core.targets) as `onnxruntime`; nothing outside `targets/` imports it directly."""
