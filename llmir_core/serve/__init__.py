"""`llmir serve`: an OpenAI-compatible server with continuous batching, and the Playground.

- `scheduler`: the continuous-batching loop over a `BatchDecoder` (llmir_core.runtime.batch_decoder);
- `schemas`: OpenAI request checking and response bodies; `metrics`: Prometheus text;
- `model`: an artifact's tokenizer + decoder + scheduler; `playground`: what the page shows;
- `app` (starlette) and `server` (uvicorn), the only importers of the web stack.
"""
