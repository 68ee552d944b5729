"""Planning: where every table goes and what that costs, before anything runs.

``plan`` (the plan's types and JSON) is what the runtime reads; ``cost_model`` (with
``cost_formulas`` and ``loads``) prices a plan on a ``ClusterSpec``; ``planner`` (with
``plan_search``, ``plan_explain``, ``plan_tools``) searches for one; ``plan_report`` formats it and
``plan_cli`` is ``neo-train plan``. Nothing here imports the runtime sharding or torch.distributed
(tests/test_layers.py checks it), so the simulator and the CLI can plan without either.

This file imports nothing: ``neo_train.planning.plan`` stays as light as the runtime needs.
"""
