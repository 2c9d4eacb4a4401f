"""Adapters that route a training stack's loss through lce without materialising the logits.

Each module here serves one library and imports it lazily, on first use: ``import lce`` never imports this
package, ``lce.integrations.transformers`` imports ``transformers`` only when a model is patched, and
``lce.integrations.trl`` imports ``trl`` only when a trainer or model is routed (the ``hf`` extra:
``pip install 'lce-lab[hf]'``).
"""
