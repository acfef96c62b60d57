"""The jobs behind the CLI: what ``ctrkit train | evaluate | predict | recall | tune | report | demo`` run.

A job reads a config or a checkpoint, checks the parameters, picks the device, seeds, picks the task from the
model's class (:mod:`ctrkit.jobs.tasks`), runs the library (data loaders, the
:class:`~ctrkit.training.trainer.Trainer`, the :class:`~ctrkit.serving.predictor.Predictor`, the faiss index) and
writes its outputs. ``ctrkit.cli`` only parses arguments and calls a job's ``run_*`` function.

Modules: :mod:`~ctrkit.jobs.common` (seeding, device, loaders, checkpoint/store agreement),
:mod:`~ctrkit.jobs.scoring` (scores and metrics of a store), :mod:`~ctrkit.jobs.tasks` (task kind -> task),
:mod:`~ctrkit.jobs.train`, :mod:`~ctrkit.jobs.evaluate`, :mod:`~ctrkit.jobs.predict`, :mod:`~ctrkit.jobs.recall`,
:mod:`~ctrkit.jobs.tune` (with :mod:`~ctrkit.jobs.tune_space`), :mod:`~ctrkit.jobs.report`,
:mod:`~ctrkit.jobs.demo`. Floor: the top one below ``cli.py``; nothing in ``src/`` but the CLI imports it.
"""
