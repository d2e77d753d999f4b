"""One-line integrations with the trainers people use, each attaching ``protect()``:

- ``integrations.hf``: ``ResilienceCallback`` for ``transformers.Trainer`` (certification over
  the Trainer's own checkpoints, ``trusted_checkpoint`` for ``resume_from_checkpoint``) and
  ``protect_accelerator`` after ``accelerator.prepare``;
- ``integrations.lightning``: ``ResilienceCallback`` for Lightning's ``Trainer``
  (``trusted_checkpoint`` for ``ckpt_path``) and ``protect_fabric`` after ``fabric.setup``;
- ``integrations.owned_checkpoints``: certification over checkpoints a trainer writes itself.

The frameworks' adapters (the optimizer boundary, the structure) are in ``frameworks/``; this
package is what a user imports, and nothing in the engine imports it."""
