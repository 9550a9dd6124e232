"""Tools around the product, never imported by the stream worker (issue #15).

The worker (:mod:`pipeline.stream.app`, ``channel-health worker``) imports
nothing from here; ``tests/unit/test_import_graph.py`` checks it. Tools may
import the runtime, never the other way round.

- :mod:`.demo` (with :mod:`.demo_stop`, :mod:`.demo_timeline`): ``channel-health demo``
- :mod:`.simulate`: the traffic simulator (``channel-health simulate``), with
  its trace samples
- :mod:`.bench`: the throughput benchmark (``channel-health bench``)
- :mod:`.quality`: training the quality model (``channel-health quality``)
- :mod:`.embedded`: the embedded Tansu broker (``channel-health broker``)
"""
