"""``channel-health bench --quality``: throughput of the quality model path (SPEC §4.5).

On the same texts in the same process (real MT-bench answers from
``../shared/data/llm-answers-judged`` when present, else synthetic text):

- ``bare_encode``: ``SentenceTransformer.encode`` of the responses (the
  same model object and torch thread cap the scorer uses) -- the ceiling;
- ``embedder``: :meth:`Embedder.encode` (text cleaning + encode);
- ``scorer_no_prompts`` / ``scorer``: :meth:`QualityScorer.score` without /
  with prompts (response, tail and prompt embeddings + the head);
- ``bare_encode_model_texts``: bare encode of exactly the texts the model
  reads for those answers (responses, tails of long ones, prompts), in
  answers/s: the ceiling of the scoring path, so the ratio to it is the
  cost of the scoring code itself (cleaning, statistics, de-duplication,
  the head).

Then the main stream's cost of scoring: the in-process hot path
(:class:`BatchProcessor` on 500-event envelopes) is timed alone, again while
the worker's scoring process (:mod:`pipeline.quality.process`: nice 10,
1 torch thread) is kept busy, and, for comparison, while a thread of the
same process keeps the scorer busy (the former design).
Runs in its own process (torch and the model stay out of the other figures).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline.tools.bench.rss import peak_rss_mb, rss_mb
from pipeline.tools.bench.stage import stage_main


def load_texts(n: int) -> tuple[list[str], list[str], str]:
    """``(prompts, responses, description)``: ``n`` MT-bench answers, or synthetic ones without the data."""
    from pipeline.tools.quality.train import default_labels_path

    path = default_labels_path()
    if path.is_file():
        rows = []
        with path.open() as fh:
            for line in fh:
                rows.append(json.loads(line))
                if len(rows) >= n:
                    break
        return [r["prompt"] for r in rows], [r["response"] for r in rows], f"{len(rows)} MT-bench answers"
    rng = np.random.default_rng(0)
    words = "the a channel model answer latency quota error request token stream user data".split()
    resp = [" ".join(rng.choice(words, size=int(rng.integers(20, 200)))) for _ in range(n)]
    return ["Explain the result."] * n, resp, f"{n} synthetic texts (no ../shared/data)"


def _rate(n: int, fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return round(n / (time.perf_counter() - t), 1)


def stream_rate(stop_after_s: float, messages: list[bytes]) -> float:
    """Events/s of a fresh :class:`BatchProcessor` over ``messages`` (repeated) for about ``stop_after_s``."""
    from pipeline.engine import Engine
    from pipeline.engine.batch import BatchProcessor

    proc = BatchProcessor(Engine())
    proc.process(messages[:8], [0] * len(messages[:8]))  # register the channels first
    n = 0
    t = time.perf_counter()
    k = 8
    while time.perf_counter() - t < stop_after_s:
        chunk = messages[k % len(messages): k % len(messages) + 8] or messages[:8]
        before = proc.events_in
        proc.process(chunk, [0] * len(chunk))
        n += proc.events_in - before
        k += 8
    return round(n / (time.perf_counter() - t), 1)


def model_texts(scorer: Any, prompts: list[str], responses: list[str]) -> list[str]:
    """The distinct cleaned texts the scorer's model encodes for these rows (what ``build_inputs`` asks for)."""
    from pipeline.quality.embedding import clean_text
    from pipeline.quality.features import build_inputs

    asked: list[str] = []

    def record(texts: list[str]) -> np.ndarray:
        asked.extend(texts)
        return np.zeros((len(texts), scorer.embedder.dim), np.float32)

    build_inputs(prompts, responses, record, lambda t: clean_text(t, scorer.embedder.max_chars)[0],
                 scorer.embedder.dim, need_tail=scorer.model.recipe.uses_tail)
    return asked


def _while_busy(seconds: float, messages: list[bytes], score: Callable[[list, list], Any],
                prompts: list[str], responses: list[str]) -> tuple[float, float]:
    """Stream events/s while ``score`` runs in a loop on 32 texts at a time, and the texts/s it scored.

    Each call gets texts never seen before (a counter appended), so no cache answers them.
    """
    busy = threading.Event()
    scored = [0]

    def keep_scoring() -> None:
        k = 0
        while not busy.is_set():
            i = (k * 32) % max(1, len(responses) - 32)
            score(prompts[i:i + 32], [f"{r} [{k}]" for r in responses[i:i + 32]])
            scored[0] += 32
            k += 1

    th = threading.Thread(target=keep_scoring, daemon=True)
    t = time.perf_counter()
    th.start()
    during = stream_rate(seconds, messages)
    busy.set()
    th.join()
    return during, round(scored[0] / (time.perf_counter() - t), 1)


def run(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    from pipeline.tools.bench import workload as W
    from pipeline.tools.bench.fill import PartitionBatcher
    from pipeline.tools.bench.run import measure_start_ms
    from pipeline.quality.artifact import current_version
    from pipeline.quality.embedding import shared_embedder
    from pipeline.quality.scorer import QualityScorer

    if current_version() is None:
        return {"error": "no promoted quality model (models/quality/CURRENT)"}
    n = int(args.get("texts", 256))
    prompts, responses, what = load_texts(n)
    n = len(responses)
    rss0 = rss_mb()
    emb = shared_embedder()
    scorer = QualityScorer(embedder=emb, batch_size=32)
    bare = emb.model
    bare.encode(responses[:16], batch_size=32)  # warm up
    scorer.score(prompts[:16], responses[:16])
    rss_model = rss_mb()
    out: dict[str, Any] = {"texts": n, "source": what, "torch_threads": torch.get_num_threads(),
                           "model_version": scorer.version}
    out["bare_encode_texts_per_s"] = _rate(n, lambda: bare.encode(responses, batch_size=32, convert_to_numpy=True))
    out["embedder_texts_per_s"] = _rate(n, lambda: emb.encode(responses, batch_size=32))
    out["scorer_no_prompts_texts_per_s"] = _rate(n, lambda: scorer.score(None, responses))
    out["scorer_texts_per_s"] = _rate(n, lambda: scorer.score(prompts, responses))
    out["scorer_ratio_to_bare_encode"] = round(out["scorer_texts_per_s"] / out["bare_encode_texts_per_s"], 3)
    # The scorer is given (prompt, response) pairs: bare encode of the same texts (each distinct prompt and
    # response once) is the like-for-like ceiling. The model also reads the tail of long answers: bare
    # encode of exactly the texts it reads gives the cost of the scoring code itself.
    from pipeline.quality.embedding import clean_text

    pair_texts = list(dict.fromkeys([clean_text(r)[0] for r in responses] + [clean_text(p)[0] for p in prompts]))
    out["bare_encode_inputs_answers_per_s"] = _rate(
        n, lambda: bare.encode(pair_texts, batch_size=32, convert_to_numpy=True))
    out["scorer_ratio_to_bare_encode_of_inputs"] = round(
        out["scorer_texts_per_s"] / out["bare_encode_inputs_answers_per_s"], 3)
    inputs = model_texts(scorer, prompts, responses)
    out["model_texts"] = len(inputs)
    out["bare_encode_model_texts_answers_per_s"] = _rate(
        n, lambda: bare.encode(inputs, batch_size=32, convert_to_numpy=True))
    out["scorer_ratio_to_bare_encode_of_model_texts"] = round(
        out["scorer_texts_per_s"] / out["bare_encode_model_texts_answers_per_s"], 3)

    ch = W.Channels.make(int(args.get("channels", 1000)))
    batcher = PartitionBatcher(4, 500)
    evs = W.stream(ch, int(args.get("events", 100_000)), measure_start_ms(), 10.0, seed=5, id_prefix="q")
    messages = [v for _, v in batcher.add(evs) + batcher.flush()]
    seconds = float(args.get("stream_seconds", 8.0))
    alone = stream_rate(seconds, messages)
    out["stream_events_per_s_alone"] = alone
    out["rss_model_mb"] = round(rss_model - rss0, 1)

    # (1) the worker's design: a ProcessScorer (child process, nice, 1 torch thread) kept busy
    from pipeline.quality.process import DEFAULT_NICE, ProcessScorer
    from pipeline.stream.quality_agent import QualitySettings

    qs = QualitySettings()
    child = ProcessScorer.start(threads=qs.torch_threads, nice=qs.nice, batch=32)
    during, rate = _while_busy(seconds, messages, lambda p, r: child.score(p, r), prompts, responses)
    child.close()
    out.update(stream_events_per_s_while_scoring=during, scoring_texts_per_s_alongside_stream=rate,
               stream_throughput_drop=round(1 - during / alone, 3) if alone else None,
               scoring_process={"nice": qs.nice, "torch_threads": qs.torch_threads, "default_nice": DEFAULT_NICE})
    # (2) for comparison, the former design: the scorer on a thread of the stream's process
    during_t, rate_t = _while_busy(seconds, messages, scorer.score, prompts, responses)
    out.update(stream_events_per_s_while_scoring_in_thread=during_t,
               stream_throughput_drop_in_thread=round(1 - during_t / alone, 3) if alone else None,
               scoring_texts_per_s_in_thread=rate_t)
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


def table(q: dict[str, Any]) -> str:
    """Printed summary of :func:`run`'s result."""
    if "error" in q:
        return f"quality benchmark: {q['error']}"
    return "\n".join([
        f"quality throughput on {q['source']}, torch threads {q['torch_threads']}, model {q['model_version']}:",
        f"  bare SentenceTransformer.encode    {q['bare_encode_texts_per_s']:8.1f} texts/s",
        f"  Embedder.encode (clean + encode)   {q['embedder_texts_per_s']:8.1f} texts/s",
        f"  QualityScorer.score, no prompts    {q['scorer_no_prompts_texts_per_s']:8.1f} texts/s",
        f"  QualityScorer.score, with prompts  {q['scorer_texts_per_s']:8.1f} texts/s "
        f"({q['scorer_ratio_to_bare_encode']:.2f}× bare encode of the responses alone)",
        f"  bare encode of the same inputs (each prompt and response) {q['bare_encode_inputs_answers_per_s']:.1f} "
        f"answers/s: the scorer reaches {q['scorer_ratio_to_bare_encode_of_inputs']:.2f}× that",
        f"  bare encode of the {q['model_texts']} texts the model reads (responses, tails of long ones, prompts): "
        f"{q['bare_encode_model_texts_answers_per_s']:.1f} answers/s; the scorer reaches "
        f"{q['scorer_ratio_to_bare_encode_of_model_texts']:.2f}× that",
        f"  main stream (in-process, batched): {q['stream_events_per_s_alone']:,.0f} events/s alone, "
        f"{q['stream_events_per_s_while_scoring']:,.0f} while the worker's scoring process runs "
        f"(nice {q['scoring_process']['nice']}, {q['scoring_process']['torch_threads']} torch thread): "
        f"-{q['stream_throughput_drop'] * 100:.0f} %, scorer meanwhile {q['scoring_texts_per_s_alongside_stream']:.1f} texts/s",
        f"  for comparison, scorer on a thread of the stream's process: "
        f"{q['stream_events_per_s_while_scoring_in_thread']:,.0f} events/s "
        f"(-{q['stream_throughput_drop_in_thread'] * 100:.0f} %), scorer {q['scoring_texts_per_s_in_thread']:.1f} texts/s",
        f"  model RSS +{q['rss_model_mb']:.0f} MB, peak RSS {q['peak_rss_mb']:.0f} MB",
    ])


def run_quality(texts: int = 256, workdir: Path | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run :func:`run` in its own process; returns its result."""
    import tempfile

    from pipeline.tools.bench.stage import run_stage

    wd = workdir or Path(tempfile.mkdtemp(prefix="channel-health-bench-quality-"))
    wd.mkdir(parents=True, exist_ok=True)
    return run_stage("quality", {"texts": texts}, wd, "quality", timeout_s)  # (uses no scratch data)


if __name__ == "__main__":
    stage_main(run)
