# Experiment of 2026-12-03 (third session), kept as the record of a measurement, not
# part of the build. Run with Debian's /usr/bin/python3 (numpy) in a directory holding
# KV dumps made by `kvstream-tinyllama dump-kv --dtype f32` ([layer][K|V][token][channel]
# f32, BOS first): kv0..kv39.bin from 900-character pieces of the eval text every 5000
# characters (0..19 train, 20..39 test), gpl0..29.bin from GPL-3 every 1000
# characters (and, for kv_typicality.py, mpl/py/shuf/rc 0..19 from MPL-2.0,
# argparse.py, word-shuffled TinyStories and random characters), pieces cut shorter
# until they fit the 512-token context. stories260K: 5 layers, 32 channels per plane,
# head size 8.
import numpy as np, glob
L,P,C,HD=5,2,32,8
def load(f):
    a=np.fromfile(f,dtype=np.float32).reshape(L,P,-1,C).copy()
    T=a.shape[2]
    pos=np.arange(T)[:,None]
    # undo RoPE on K (pairs within each head of 8)
    i=np.arange(HD//2)
    freq=1.0/(10000**(2*i/HD))
    ang=pos*freq[None,:]           # T x 4
    c,s=np.cos(ang),np.sin(ang)
    for l in range(L):
        k=a[l,0].reshape(T,C//HD,HD)
        x0,x1=k[...,0::2].copy(),k[...,1::2].copy()
        k[...,0::2]=x0*c[:,None,:]+x1*s[:,None,:]
        k[...,1::2]=-x0*s[:,None,:]+x1*c[:,None,:]
        a[l,0]=k.reshape(T,C)
    return a[:,:,1:,:]  # drop BOS
train=[load(f'kv{i}.bin') for i in range(20)]
test=[load(f'kv{i}.bin') for i in range(20,40)]
gpl=[load(f'gpl{i}.bin') for i in range(30)]
tr=np.concatenate(train,axis=2)
mu=tr.mean(axis=2,keepdims=True); sd=tr.std(axis=2,keepdims=True)+1e-6
R=12
def quant(a,step): return np.clip(np.rint((a-mu)/(sd*step)),-R,R).astype(int)
def ctxof(q,kind):
    p=np.zeros_like(q)
    p[:,:,1:,:]=q[:,:,:-1,:]
    if kind=='none': return np.zeros_like(q)
    if kind=='prev3': return np.clip(p,-1,1)+1
    if kind=='prevabs': return np.minimum(np.abs(p),3)
    if kind=='prev5': return np.clip(p,-2,2)+2
    if kind=='prev9': return np.clip(p,-4,4)+4
    if kind=='prevnb':  # prev token same channel + left channel same token
        n=np.zeros_like(q); n[:,:,:,1:]=q[:,:,:,:-1]
        return (np.clip(p,-2,2)+2)*3+np.clip(np.abs(n),0,2)
def xent(trs,tes,kind,step):
    # tables per (layer,plane,channel,context), fitted on trs, cross-entropy on tes
    nb=2*R+1; nctx=16
    counts=np.ones((L,P,C,nctx,nb))*0.02
    for a in trs:
        q=quant(a,step); c=ctxof(q,kind)
        li,pi,ti,ci=np.indices(q.shape)
        np.add.at(counts,(li,pi,ci,c,q+R),1)
    prob=counts/counts.sum(-1,keepdims=True)
    bits=0;n=0
    for a in tes:
        q=quant(a,step); c=ctxof(q,kind)
        li,pi,ti,ci=np.indices(q.shape)
        bits+=-np.log2(prob[li,pi,ci,c,q+R]).sum(); n+=q.size
    return bits/n
for step in (0.15,0.3,0.6,1.2):
    row=[]
    for kind in ('none','prev3','prevabs','prev5','prev9','prevnb'):
        row.append((kind,xent(train,test,kind,step),xent(train,gpl,kind,step)))
    base=row[0]
    print(f'step {step}: none {base[1]:.3f}/{base[2]:.3f} | '+' '.join(f'{k} {a/base[1]:.3f}/{b/base[2]:.3f}' for k,a,b in row[1:]))
