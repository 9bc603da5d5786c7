# Experiment of 2026-12-03 (third session), kept as the record of a measurement, not
# part of the build. Run with Debian's /usr/bin/python3 (numpy) in a directory holding
# KV dumps made by `kvstream-tinyllama dump-kv --dtype f32` ([layer][K|V][token][channel]
# f32, BOS first): kv0..kv39.bin from 900-character pieces of the eval text every 5000
# characters (0..19 train, 20..39 test), gpl0..29.bin from GPL-3 every 1000
# characters (and, for kv_typicality.py, mpl/py/shuf/rc 0..19 from MPL-2.0,
# argparse.py, word-shuffled TinyStories and random characters), pieces cut shorter
# until they fit the 512-token context. stories260K: 5 layers, 32 channels per plane,
# head size 8.
import numpy as np
exec(open("entropy_context.py").read().split("train=[")[0])  # load() and the constants
sets={'ts':[f'kv{i}.bin' for i in range(20,40)],'shuf':[f'shuf{i}.bin' for i in range(20)],'gpl':[f'gpl{i}.bin' for i in range(30)],
      'mpl':[f'mpl{i}.bin' for i in range(20)],'py':[f'py{i}.bin' for i in range(20)],'rc':[f'rc{i}.bin' for i in range(20)]}
train=[load(f'kv{i}.bin') for i in range(20)]
tr=np.concatenate(train,axis=2)  # L,P,T,C
stats={}
for l in range(L):
    for p in range(P):
        x=tr[l,p]; m=x.mean(0); cov=np.cov(x.T)+1e-6*np.eye(C)
        stats[l,p]=(m,np.linalg.inv(cov))
def maha(a,l,p):
    m,ic=stats[l,p]; d=a[l,p]-m
    return np.einsum('tc,cd,td->t',d,ic,d)
print('set   '+' '.join(f'L{l}{"KV"[p]}' for l in range(L) for p in range(P)))
for k,fs in sets.items():
    arr=[load(f) for f in fs]
    vals=[np.median(np.concatenate([maha(a,l,p) for a in arr]))/C for l in range(L) for p in range(P)]
    print(f'{k:5s} '+' '.join(f'{v:5.2f}' for v in vals))
