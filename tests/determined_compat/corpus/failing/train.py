"""A Determined script whose data are missing: it fails the way real ones do."""

import determined as det

info = det.get_cluster_info()
print(f"trial {info.trial.trial_id} starting")
raise FileNotFoundError("training data not found: /data/missing.csv")
