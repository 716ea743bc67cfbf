"""The SDK inside training frameworks that own the loop: a ``transformers.TrainerCallback``
(:mod:`cann_train.integrations.transformers`) and a Lightning ``Callback`` (:mod:`cann_train.integrations.lightning`).
Each module imports its framework; import the one you use."""
