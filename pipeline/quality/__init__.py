"""Embedding-based answer-quality model (SPEC §4.5).

Modules: ``embedding`` (offline sentence-transformers encoder, text cleaning),
``features`` (named, versioned feature recipes), ``head`` (L2-regularised
logistic head fit with scipy), ``artifact`` (versioned model files under
``models/quality/<version>/``), ``train`` (labels, group split, fit,
evaluation, promotion), ``ship`` (train a version from a labelled file with
the card's extra checks), ``card`` (MODEL_CARD.md), ``scorer`` (batched
scoring off the event loop) and ``cli`` (the ``channel-health quality ...``
sub-commands).

Heavy imports (torch, sentence-transformers) happen only when an
:class:`~pipeline.quality.embedding.Embedder` is created.
"""
