"""Ingest: Kafka message bytes -> validated request events or dead letters (SPEC §3),
and the structured-output check (SPEC §4.4).

Modules: ``decode`` (:class:`Decoder`), ``dead_letter`` (:class:`DeadLetter`,
the DLQ value), ``reasons`` (reason codes), ``counters``
(:class:`DecodeCounters`), ``structure`` (:func:`check_structure`,
:func:`resolve_structure`, :func:`resolve_onto`: the structure verdict, resolved once per
event by the decoder), ``envelope`` (:func:`storable_envelope`: whether a batch envelope's
bytes say what the decoder made of them).
"""

from pipeline.ingest.counters import DecodeCounters
from pipeline.ingest.dead_letter import DeadLetter
from pipeline.ingest.decode import DecodeResult, Decoder
from pipeline.ingest.structure import StructureResult, check_structure, resolve_onto, resolve_structure

__all__ = [
    "DeadLetter",
    "DecodeCounters",
    "DecodeResult",
    "Decoder",
    "StructureResult",
    "check_structure",
    "resolve_onto",
    "resolve_structure",
]
