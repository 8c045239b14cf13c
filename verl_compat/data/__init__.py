"""Dataset preparation in verl's RL parquet format (`verl-compat data NAME`)."""
