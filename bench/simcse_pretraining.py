"""The encoder of bench.fewshot's ``simcse-ce`` method: unsupervised SimCSE (the command line's
``train_simcse``, every option at its default but the number of steps) on the training pool's
texts, without their labels and without the test rows, trained once and reused by every K and
seed of a comparison."""
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from bench.harness.report import write_json
from scl_kernels.finetune.data import InputError
from scl_kernels.finetune.simcse import SimCSEOptions, load_encoder, train_simcse
from scl_kernels.finetune.training_loop import import_transformers, load_tokenizer

RECORD = "simcse.json"
SEED = 0


def simcse_encoder(model, texts, directory, steps):
    """Trains (or finds, when ``directory`` holds one made from the same model, texts and steps)
    a SimCSE encoder of ``model`` on ``texts``, saved with its tokenizer in ``directory``.

    Args:
        model: the encoder to start from (a directory or a Hub name).
        texts: the unlabelled sentences (each one encoded twice a step, dropout as augmentation).
        directory: where the encoder, its tokenizer and ``simcse.json`` go.
        steps: optimiser steps of SimCSE's default batch (64 sentences).

    Returns:
        The record in ``simcse.json``: the encoder's path, model, steps, options, texts, seconds,
        encoder passes, first and last loss.

    Raises:
        InputError: ``directory`` holds an encoder made with other settings.
    """
    directory = Path(directory)
    wanted = {"model": str(model), "texts": len(texts), "steps": steps}
    path = directory / RECORD
    if path.exists():
        record = json.loads(path.read_text(encoding="utf-8"))
        made = {key: record.get(key) for key in wanted}
        if made != wanted:
            raise InputError(f"{directory} holds a SimCSE encoder made with {made}, not {wanted}: "
                             "pass another --output-dir")
        return record
    options = SimCSEOptions(max_steps=steps, seed=SEED, progress=False)
    tokenizer = load_tokenizer(model)
    import_transformers().set_seed(SEED)
    encoder = load_encoder(model)
    started = time.perf_counter()
    losses = train_simcse(encoder, tokenizer, [list(texts)], options)
    seconds = time.perf_counter() - started
    directory.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    record = {**wanted, "path": str(directory), "options": asdict(options),
              "seconds": seconds, "torch_threads": torch.get_num_threads(),
              # One pass of the batch's 2 x 64 views a step (no gradient cache at the default).
              "encoded_examples": 2 * options.batch_size * steps,
              "loss_first": losses[0], "loss_last": losses[-1]}
    write_json(str(path), record)
    return record
