"""FedCache 2.0 on feature vectors (the paper's audio/sensor tasks): FCN clients, K=100.

The paper's UrbanSound8K and TMD settings (its Tables VI-X):
every client an FCN (Dense 512-256, dropout 0.5), FedML Dirichlet alpha, 15
rounds, distilled feature vectors sent as float32. The data set is a Keras-layout
npz of features you prepare (x_train [N, D] float32 already scaled, y_train [N],
x_test, y_test), e.g. 40 mean MFCCs per UrbanSound8K clip, or the TMD feature
table scaled by each column's max |value| as in the authors' code. The argument
after ':' is the npz path (default `tmd_features.npz` in the working directory;
a missing file stops the run before any compute), optionally followed by
',ALPHA' (default 0.5).

  python -m fedjax_kd.main --config=configs/fedcache2_sensor.py:/data/tmd.npz,0.5 \
      --workdir=runs/fc2_tmd
"""

from fedjax_kd.config import presets


def get_config(arg: str = 'tmd_features.npz'):
  path, _, alpha = arg.partition(',')
  a = float(alpha or 0.5)
  c = presets.fedcache2_paper(a)
  c.data.source = f'npz:{path}'
  c.clients.models = ['fcn@1.0']
  c.server.model = 'fcn@1.0'
  c.fedcache2.encoding = 'raw'            # float32, 4 bytes per feature
  c.comm.thresholds = [0.5] if a < 1.0 else [0.45]   # Tables VII and X
  return c
