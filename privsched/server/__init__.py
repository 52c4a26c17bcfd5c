"""The HTTP API of a privsched scheduler: a FastAPI app over one ledger file
(:mod:`privsched.server.app`), the JSON models it shares with the remote client
(:mod:`privsched.server.models`), and the uvicorn runner that serves it beside the
scheduler (:mod:`privsched.server.runner`). Importing this package imports nothing heavy.
"""
