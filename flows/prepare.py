"""Stage `prepare`: the task's train/val/test tables at data/processed/<task>/ (pandera-validated).

Made by the task's recipe from its own params section `tasks.<task>` (generated from `seed`, or read
from a file the section names) with `prepare.n_train` / `n_val` / `n_test` rows. Every table is
validated against `TaskSchema` before it is written; a bad source row stops the stage before any
output exists, naming the file, the row and the column.
"""

from __future__ import annotations

from prefect import flow, task

from components.config import Params
from components.envs import get_task
from components.io import write_parquet
from components.schemas import TaskSchema, validate_table
from flows import REPO, processed
from flows._stage import StageError, read_params, stage_main


def make_splits(params: Params) -> dict:
    p = params.prepare
    try:
        splits = get_task(params.task).prepare(
            params.task_params,
            seed=params.seed,
            n_train=p.n_train,
            n_val=p.n_val,
            n_test=p.n_test,
            root=REPO,
            data_dir=processed(params.task),
        )
        return {
            name: validate_table(df, TaskSchema, f"{params.task} {name} split") for name, df in splits.items()
        }
    except ValueError as err:  # a bad source row or an impossible request, named by the task
        raise StageError(str(err)) from None


@task
def write_splits(params: Params, splits: dict) -> list[str]:
    out = processed(params.task)
    paths = [str(write_parquet(df, out / f"{name}.parquet")) for name, df in splits.items()]
    for name, df in splits.items():
        print(f"{name}: {df.height} rows -> {out / (name + '.parquet')}")
    return paths


@flow(name="prepare", log_prints=True)
def prepare_flow(params: Params, splits: dict) -> list[str]:
    return write_splits(params, splits)


def main(params: str) -> None:
    p = read_params(params)
    splits = make_splits(p)  # before the flow: a bad row is one clear line and nothing is written
    prepare_flow(p, splits)


if __name__ == "__main__":
    stage_main(main)
