"""Integrations with web frameworks (docs/frameworks.md): `livepush.contrib.django` and
`livepush.contrib.starlette` (Starlette and FastAPI). Each imports its framework only when it
is imported itself, so livepush needs none of them."""
