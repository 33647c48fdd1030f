"""DS-FL on IMDb (the paper's text task 1): 10 clients, LSTM, 9:1 sentiment skew, 100 rounds.

10,000 open and 15,000 private reviews (1,500 per client; half the clients hold 1,350
positive and 150 negative reviews, half the reverse), `imdb_lstm` (Embedding 20,000 x 32,
LSTM 32) for clients and server, ERA with T = 0.1, Adam 0.001, batch 128, 5 + 5 epochs,
1,000 open reviews a round. Data: a token-id npz made once with

  python -m fedjax_kd.data.text imdb --aclimdb=/path/to/aclImdb --out=imdb.npz

(or --keras), or tfds:imdb_reviews prepared in array_record format. Then

  fedjax-kd --config=dsfl_imdb --workdir=runs/dsfl_imdb --config.data.source=npz:imdb.npz
"""

from fedjax_kd.config import presets


def get_config():
  return presets.dsfl_text('imdb', 'npz:imdb.npz')
