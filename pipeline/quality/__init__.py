"""Embedding-based answer-quality model (SPEC §4.5).

Modules: ``embedding`` (offline sentence-transformers encoder, text cleaning),
``features`` (named, versioned feature recipes), ``head`` (L2-regularised
logistic head fit with scipy), ``artifact`` (versioned model files under
``models/quality/<version>/``), ``scorer`` (batched scoring off the event
loop), ``cache``, ``process`` and ``sampler`` (which answers get scored).
Training (labels, fit, promotion, model card, the ``channel-health quality``
sub-commands) is a tool: :mod:`pipeline.tools.quality`.

Heavy imports (torch, sentence-transformers) happen only when an
:class:`~pipeline.quality.embedding.Embedder` is created.
"""
