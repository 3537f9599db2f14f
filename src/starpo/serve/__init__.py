"""`starpo serve`: a model behind an OpenAI-compatible HTTP endpoint.

`command` holds the CLI (importable without FastAPI); `app.build_app` the FastAPI app;
`batcher.Batcher` gathers concurrent requests into batched generate calls.
"""
