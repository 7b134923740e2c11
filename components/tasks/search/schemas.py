"""pandera (polars) schemas of the search task's tables (validated with ``components.schemas.validate_table``).

- :class:`PassageSchema`: the retrieval corpus, one row per passage (``id`` unique, non-empty ``text``).
- :class:`SearchTaskSchema`: a search task split: the common TaskSchema columns plus ``n_hops`` (searches
  the expert makes, >= 0) and ``gold_titles`` (JSON list of the titles of the passages a solver needs,
  the supporting facts; used for the retrieval hit rate).
"""

from __future__ import annotations

import pandera.polars as pa

from components.schemas import TaskSchema

__all__ = ["PassageSchema", "SearchTaskSchema"]


class PassageSchema(pa.DataFrameModel):
    id: str = pa.Field(unique=True)
    title: str
    text: str = pa.Field(str_length={"min_value": 1})

    class Config:
        strict = False
        coerce = True


class SearchTaskSchema(TaskSchema):
    n_hops: int = pa.Field(ge=0)
    gold_titles: str = pa.Field(str_startswith="[")
