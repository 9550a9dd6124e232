"""Training the answer-quality model (SPEC §4.5): the data team's loop.

Modules: ``labels`` (label files and the label rule), ``train`` (group split,
fit, evaluation, promotion), ``ship`` (train a version from a labelled file
with the card's extra checks), ``card`` (MODEL_CARD.md) and ``cli`` (the
``channel-health quality ...`` sub-commands). The runtime scorer the worker
uses stays in :mod:`pipeline.quality`.
"""
