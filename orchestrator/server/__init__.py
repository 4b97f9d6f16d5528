"""``chorus server``: the HTTP API (FastAPI, served by uvicorn).

Versioned under ``/v1``: jobs (submit, status, usage, result, output,
cancel, list, events), conversations (send, queue, history, fork, usage,
events), approvals (list, answer), readiness. Every route but ``/v1/health`` and ``/v1/ready`` takes
a bearer token (``chorus token create``); its tenant is stored with the jobs
it submits, and another tenant's ids answer 404. Errors are JSON
``{"type", "message", "fields"}`` (:mod:`orchestrator.server.errors`).
Live events are Server-Sent Events whose ids are event seqs
(:mod:`orchestrator.server.sse`). ``create_app`` is in
:mod:`orchestrator.server.app`; nothing here imports FastAPI, so ``chorus
--help`` stays light.
"""
