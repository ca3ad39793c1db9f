"""Data: load data sets (jsonl, json, parquet, HF datasets, verl rows) into `Task`s, render
prompts from templates, and iterate over batches of tasks.

    from seekrl.data import load_tasks, get_template, TaskIterator
    tasks = load_tasks("gsm8k", template=get_template("gsm8k"))
    batches = TaskIterator(tasks, batch_size=16, seed=0)
"""

from seekrl.data.converters import (
    CONVERTERS,
    detect_converter,
    fields_row,
    gsm8k_row,
    math_row,
    qa_row,
    verl_row,
)
from seekrl.data.iterator import TaskIterator
from seekrl.data.loaders import BUILTINS, DATA_DIR_ENV, load_tasks, read_rows, resolve_data_dir
from seekrl.data.templates import PRESETS, PromptTemplate, get_template
from seekrl.errors import DataError

__all__ = [
    "BUILTINS",
    "CONVERTERS",
    "DATA_DIR_ENV",
    "DataError",
    "PRESETS",
    "PromptTemplate",
    "TaskIterator",
    "detect_converter",
    "fields_row",
    "get_template",
    "gsm8k_row",
    "load_tasks",
    "math_row",
    "qa_row",
    "read_rows",
    "resolve_data_dir",
    "verl_row",
]
