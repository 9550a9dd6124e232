"""``channel-health quality ...``: the data team's loop for the quality model.

Commands print human notes to stderr and one JSON object as the last line
of stdout, so scripts can ``tail -n1 | jq``.

- ``import-labels FILE.jsonl``  labelled rows -> ClickHouse ``quality_labels``
- ``train [--labels FILE | --from-clickhouse] [--force]``  fit a new version;
  promote it if its held-out ROC-AUC is >= the current model's on the same split
- ``evaluate --labels FILE.jsonl [--model VERSION]``  ROC-AUC of a version
- ``score --response TEXT [--prompt TEXT]``  score one answer

``quality_labels`` rows: ``label`` is 1 (good) / 0 (bad) after the label rule
(scores are mapped, ambiguous ones skipped); ``label_id`` is
``<group>|<sha256(prompt, response)[:24]>`` so re-importing replaces a row and
the group (model/channel) survives for group-split training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Quality model: import labels, train (with promotion), evaluate, score.",
)

log = logging.getLogger(__name__)


def _emit(obj: dict[str, Any]) -> None:
    typer.echo(json.dumps(obj, sort_keys=True, default=str))


def _embedder(path: Optional[Path]):
    from pipeline.quality.embedding import EmbeddingModelError, shared_embedder

    try:
        return shared_embedder(path)
    except EmbeddingModelError as exc:
        typer.secho(f"embedding model error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


# ------------------------------------------------------------ import-labels


def label_id_for(group: str | None, prompt: str, response: str) -> str:
    """Stable id of a labelled pair; the group (model/channel) is kept as prefix.

    >>> label_id_for("m1", "p", "r").startswith("m1|")
    True
    """
    h = hashlib.sha256(f"{prompt}\0{response}".encode("utf-8", "replace")).hexdigest()[:24]
    return f"{(group or '-').replace('|', '/')}|{h}"


def label_rows_for_table(rows: Iterable[Any], source: str) -> tuple[list[tuple], Counter]:
    """``LabelledRow``s -> ``quality_labels`` tuples (skips counted by reason)."""
    from pipeline.sinks.rows import label_row

    out: list[tuple] = []
    skipped: Counter = Counter()
    seen: set[str] = set()
    for r in rows:
        if not isinstance(r.response, str):
            skipped["not_text"] += 1
            continue
        prompt = r.prompt or ""
        lid = label_id_for(r.group, prompt, r.response)
        if lid in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(lid)
        out.append(label_row(lid, prompt, r.response, int(r.label), source))
    return out, skipped


def write_labels(client: Any, table_rows: Sequence[tuple], batch: int = 2000) -> int:
    """Insert ``quality_labels`` tuples with a clickhouse-connect client (HTTP or chDB)."""
    from pipeline.sinks.rows import QUALITY_LABEL_COLUMNS, QUALITY_LABELS_TABLE

    n = 0
    for i in range(0, len(table_rows), batch):
        chunk = list(table_rows[i : i + batch])
        client.insert(QUALITY_LABELS_TABLE, chunk, column_names=list(QUALITY_LABEL_COLUMNS))
        n += len(chunk)
    return n


def read_labels(client: Any, source: str | None = None):
    """``quality_labels`` -> ``LabelledRow``s (group from the ``label_id`` prefix)."""
    from pipeline.tools.quality.train import LabelledRow, LoadedLabels
    from pipeline.sinks.rows import QUALITY_LABELS_TABLE

    sql = f"SELECT label_id, prompt, response, label, source FROM {QUALITY_LABELS_TABLE} FINAL"
    params: dict[str, Any] = {}
    if source:
        sql += " WHERE source = {source:String}"
        params["source"] = source
    res = client.query(sql, parameters=params)
    rows = []
    skipped: Counter = Counter()
    for label_id, prompt, response, label, _src in res.result_rows:
        if int(label) not in (0, 1):
            skipped["label_not_binary"] += 1
            continue
        group = label_id.split("|", 1)[0] if "|" in label_id else None
        rows.append(
            LabelledRow(
                response=response,
                label=int(label),
                prompt=prompt or None,
                group=None if group in (None, "-") else group,
            )
        )
    return LoadedLabels(rows, skipped, f"clickhouse:{QUALITY_LABELS_TABLE}")


def _open_storage():
    from pipeline.config import ConfigError, load_settings
    from pipeline.storage.client import open_client
    from pipeline.storage.schema import apply_ddl

    try:
        settings = load_settings()
    except ConfigError as exc:
        typer.secho(f"configuration error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    client = open_client(settings)
    apply_ddl(client)
    return client


@app.command("import-labels")
def import_labels(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON lines: {prompt?, response, label} or {response, score, scale}."),
    source: Optional[str] = typer.Option(None, help="Value of the `source` column (default: the file's stem)."),
) -> None:
    """Load labelled answers into ClickHouse `quality_labels` (CHANNEL_HEALTH_CLICKHOUSE_URL)."""
    from pipeline.tools.quality.train import load_rows

    loaded = load_rows(file)
    table_rows, skipped = label_rows_for_table(loaded.rows, source or file.stem)
    skipped.update(loaded.skipped)
    client = _open_storage()
    n = write_labels(client, table_rows)
    typer.echo(f"imported {n} labelled rows from {file}; skipped {dict(skipped)}", err=True)
    _emit({"imported": n, "skipped": dict(skipped), "source": source or file.stem, "file": str(file)})


# ------------------------------------------------------------ train / evaluate


@app.command()
def train(
    labels: Optional[Path] = typer.Option(None, "--labels", exists=True, dir_okay=False, help="Labelled JSON lines (default: ../shared/data/llm-answers-judged/mt_bench_judged.jsonl)."),
    from_clickhouse: bool = typer.Option(False, "--from-clickhouse", help="Train on the `quality_labels` table instead of a file."),
    force: bool = typer.Option(False, "--force", help="Promote even if the held-out ROC-AUC is below the current model's."),
    models_dir: Optional[Path] = typer.Option(None, help="Artifact root (default: models/quality)."),
    embedding_model: Optional[Path] = typer.Option(None, help="Local sentence-transformers model dir (default: bundled all-MiniLM-L6-v2)."),
    recipe: str = typer.Option("rich-v1", help="Feature recipe (rich-v1, plain-v1)."),
    version: Optional[str] = typer.Option(None, help="Version name (default: next vN)."),
    test_fraction: float = typer.Option(0.25, min=0.05, max=0.9, help="Share of rows (whole groups) held out."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="Reuse/extend the embedding cache in .cache/quality."),
) -> None:
    """Fit a new quality-model version, split by model/channel; promote only if not worse."""
    from pipeline.tools.quality import ship, train as tr
    from pipeline.quality.embedding import EmbeddingCache

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if not from_clickhouse and labels is None and not tr.default_labels_path().is_file():
        # Checked before loading the embedding model (seconds); a plain clone has no ../shared/data.
        typer.secho(f"no --labels and {tr.default_labels_path()} is absent", fg="red", err=True)
        raise typer.Exit(2)
    emb = _embedder(embedding_model)
    if from_clickhouse:
        loaded = read_labels(_open_storage())
        if not loaded.rows:
            typer.secho("quality_labels holds no binary labels", fg="red", err=True)
            raise typer.Exit(1)
        split = tr.split_by_group(loaded.rows, test_fraction)
        res = tr.train_and_maybe_promote(
            loaded.rows,
            split,
            force=force,
            embedder=emb,
            models_dir=models_dir,
            recipe=recipe,
            version=version,
            cache=EmbeddingCache(tr.default_cache_dir(), emb.info) if cache else None,
            data_summary={"source": loaded.source, "skipped": dict(loaded.skipped)},
        )
    else:
        res = ship.train_from_file(
            labels,
            force=force,
            models_dir=models_dir,
            embedder=emb,
            recipe=recipe,
            version=version,
            test_fraction=test_fraction,
            use_cache=cache,
        )
    typer.echo(f"{res.version}: {res.reason} ({res.path})", err=True)
    _emit(
        {
            "model_version": res.version,
            "promoted": res.promoted,
            "reason": res.reason,
            "roc_auc": res.new_roc_auc,
            "current_version": res.current_version,
            "current_roc_auc": res.current_roc_auc,
            "path": str(res.path),
        }
    )


@app.command()
def evaluate(
    labels: Path = typer.Option(..., "--labels", exists=True, dir_okay=False, help="Labelled JSON lines."),
    model: Optional[str] = typer.Option(None, "--model", help="Version (default: the promoted one)."),
    models_dir: Optional[Path] = typer.Option(None, help="Artifact root (default: models/quality)."),
    embedding_model: Optional[Path] = typer.Option(None, help="Local sentence-transformers model dir."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="Reuse/extend the embedding cache in .cache/quality."),
) -> None:
    """ROC-AUC of a model version on a labelled file (last line: JSON with roc_auc, n, model_version)."""
    from pipeline.quality.artifact import ArtifactError, load_model
    from pipeline.quality.embedding import EmbeddingCache
    from pipeline.tools.quality.train import default_cache_dir
    from pipeline.tools.quality.train import evaluate as run_eval
    from pipeline.tools.quality.train import load_rows

    loaded = load_rows(labels)
    emb = _embedder(embedding_model)
    try:
        m = load_model(model, models_dir, embedding=emb.info)
    except ArtifactError as exc:
        typer.secho(f"cannot load quality model: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    if not loaded.rows:
        typer.secho(f"no labelled rows in {labels}", fg="red", err=True)
        raise typer.Exit(1)
    n_good = sum(r.label for r in loaded.rows)
    if n_good in (0, len(loaded.rows)):
        typer.secho("ROC-AUC needs both good and bad rows", fg="red", err=True)
        raise typer.Exit(1)
    out = run_eval(
        m, loaded.rows, emb, cache=EmbeddingCache(default_cache_dir(), emb.info) if cache else None
    )
    out["skipped"] = dict(loaded.skipped)
    out["labels"] = str(labels)
    _emit(out)


@app.command()
def score(
    response: str = typer.Option(..., help="The answer text."),
    prompt: Optional[str] = typer.Option(None, help="The prompt (optional)."),
    model: Optional[str] = typer.Option(None, "--model", help="Version (default: the promoted one)."),
    models_dir: Optional[Path] = typer.Option(None, help="Artifact root (default: models/quality)."),
) -> None:
    """Score one answer: P(good answer) in [0, 1]."""
    from pipeline.quality.scorer import QualityScorer

    s = QualityScorer(model, models_dir=models_dir)
    rep = s.score_detailed([prompt], [response])
    _emit({"score": round(float(rep.scores[0]), 4), "reasons": rep.reasons[0], "model_version": rep.model_version})
