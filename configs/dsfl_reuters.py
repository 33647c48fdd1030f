"""DS-FL on Reuters (the paper's text task 2): 10 clients, text-DNN on a bag of words, 100 rounds.

Keras' Reuters split (8,982 training headlines, 46 topics): 3,982 open and 5,000 private,
sorted by topic and cut into one shard of 500 per client; `text_dnn` (10,000 -> 512 -> 128
-> 46 with BatchNorm, 5,194,670 numbers) for clients and server, ERA with T = 0.1, Adam
0.001, batch 128, 5 + 5 epochs, 1,000 open headlines a round. Data: a token-id npz made once
with

  python -m fedjax_kd.data.text reuters --keras --out=reuters.npz

(it needs Keras, which downloads its own copy). Then

  fedjax-kd --config=dsfl_reuters --workdir=runs/dsfl_reuters --config.data.source=npz:reuters.npz
"""

from fedjax_kd.config import presets


def get_config():
  return presets.dsfl_text('reuters', 'npz:reuters.npz')
