"""pandera (polars) schema of a search_calc split: the common TaskSchema columns plus ``kind`` (the
question kind, ``questions.KINDS``), ``n_searches`` (searches the expert makes) and ``gold_titles``
(JSON list of the names searched, whose passages hold the question's numbers)."""

from __future__ import annotations

import pandera.polars as pa

from components.schemas import TaskSchema

__all__ = ["SearchCalcTaskSchema"]


class SearchCalcTaskSchema(TaskSchema):
    kind: str = pa.Field(str_length={"min_value": 1})
    n_searches: int = pa.Field(ge=1)
    gold_titles: str = pa.Field(str_startswith="[")
