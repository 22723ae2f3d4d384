//! Conv and ConvTranspose on PE (im2col scratch from the arena; a following inference
//! BatchNormalization folded into the weights). A 3-D ConvTranspose decomposes into a 2-D
//! one over every input depth slice at once and a MatMul that sums each slice's kernel-depth
//! planes into their output depths ([`expand_conv_transpose_3d`]); a 3-D Conv decomposes
//! into a depth-padding Pad, a Gather stacking each output depth's kernel-depth input slices
//! as channels, and one 2-D Conv over all output depth slices as a batch
//! ([`expand_conv_3d`]).

use super::Registry;
use super::norm::bn_affine;
use crate::error::{ErrorKind, Result};
use crate::eval::dense_strides;
use crate::lower::view::{View, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params;
use crate::params::{Ctx, Out, conv_transpose_params, out, window_params};
use crate::tensor::HostTensor;
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, Op, Window};

/// No activation after a convolution.
pub(crate) const NO_ACT: (ActFunc, f32, f32) = (ActFunc::Identity, 0.0, 0.0);

pub(super) fn register(r: &mut Registry) {
    r.op("Col2Im", 18, infer_col2im)
        .f32_on_device()
        .note("image and block shapes known at compile time: one strided DVE add per block offset")
        .device(lower!(lower_col2im));
    r.op("Conv", 1, infer_conv)
        .f32_on_device()
        .note("1-D and 2-D; 3-D as one 2-D Conv over the output depth slices with the kernel depth taps as extra input channels")
        .expands_when(is_3d, expand_conv_3d)
        .device(lower!(lower_conv));
    r.op("ConvTranspose", 1, infer_conv_transpose)
        .f32_on_device()
        .note("1-D and 2-D; 3-D as one 2-D ConvTranspose over the depth slices and a MatMul placing them")
        .expands_when(is_3d, expand_conv_transpose_3d)
        .device(lower!(lower_conv_transpose));
}

/// Conv: grouped, 1-D or 2-D, window geometry from `window_params`.
pub(crate) fn infer_conv(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let (x, w) = (c.input(0)?, c.input(1)?);
    let r = x.shape.len();
    if r < 3 || w.shape.len() != r {
        return Err(c.mismatch(format!("Conv of {:?} with weights {:?}", x.shape, w.shape)));
    }
    if r > 4 {
        return Err(c.e(ErrorKind::UnsupportedOp, format!("{}-D convolution", r - 2)));
    }
    let group = n.attr_i("group", 1)?;
    if group < 1 || x.shape[1] as i64 % group != 0 || w.shape[0] as i64 % group != 0 {
        return Err(c.bad_attr(format!("group {group}")));
    }
    if w.shape[1] * group as usize != x.shape[1] {
        return Err(c.mismatch(format!(
            "weights {:?} for {} input channels in {group} groups",
            w.shape, x.shape[1]
        )));
    }
    let kernel: Vec<usize> = w.shape[2..].to_vec();
    if let Some(ks) = n.attr_ints("kernel_shape")?
        && ks.iter().map(|&k| k as usize).collect::<Vec<_>>() != kernel
    {
        return Err(c.mismatch(format!("kernel_shape {ks:?} but weights {:?}", w.shape)));
    }
    if let Some(b) = c.opt(2)
        && b.elements() != w.shape[0]
    {
        return Err(c.mismatch(format!(
            "bias of {} for {} channels",
            b.elements(),
            w.shape[0]
        )));
    }
    let p = window_params(c, &x.shape[2..], kernel, false)?;
    let mut s = vec![x.shape[0], w.shape[0]];
    s.extend(&p.out);
    Ok(vec![out(x.dtype, s)])
}

/// ConvTranspose: output size from `conv_transpose_params`.
pub(crate) fn infer_conv_transpose(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let (x, w) = (c.input(0)?, c.input(1)?);
    let r = x.shape.len();
    if r < 3 || w.shape.len() != r {
        return Err(c.mismatch(format!(
            "ConvTranspose of {:?} with weights {:?}",
            x.shape, w.shape
        )));
    }
    if r > 4 {
        return Err(c.e(ErrorKind::UnsupportedOp, format!("{}-D convolution", r - 2)));
    }
    let group = n.attr_i("group", 1)? as usize;
    if group < 1 || x.shape[1] % group != 0 || w.shape[0] != x.shape[1] {
        return Err(c.mismatch(format!(
            "weights {:?} for {} input channels in {group} groups",
            w.shape, x.shape[1]
        )));
    }
    let p = conv_transpose_params(c, &x.shape[2..], w.shape[2..].to_vec())?;
    let mut s = vec![x.shape[0], w.shape[1] * group];
    s.extend(&p.out);
    Ok(vec![out(x.dtype, s)])
}

/// Whether node `n` is a 3-D Conv or ConvTranspose (its input is 5-D).
fn is_3d(g: &crate::graph::Graph, n: &crate::graph::Node) -> bool {
    n.inputs
        .first()
        .copied()
        .flatten()
        .is_some_and(|x| g.values[x].shape.len() == 5)
}

/// Replaces the 3-D `ConvTranspose` node `ni` (X `[N, C, D, H, W]`, W `[C, O/g, KD, KH,
/// KW]`) by nodes the device computes. Input depth `i` and kernel depth `k` contribute the
/// 2-D transposed convolution of slice `X[:, :, i]` with `W[:, :, k]` to output depth
/// `i·s + k·d − pad`; so one 2-D ConvTranspose runs over the `N·D` slices as a batch with
/// the kernel depths as extra output channels (`W` as `[C, KD·O/g, KH, KW]`), and a MatMul
/// with a constant 0/1 matrix `[OD, D·KD]` sums the planes into their output depths (rows
/// of output padding or not reached stay 0); the bias is added last. H and W keep their
/// strides, dilations and pads (the 3-D output padding of an axis becomes 2-D end padding
/// or output padding, whichever is not negative).
fn expand_conv_transpose_3d(g: &mut crate::graph::Graph, ni: usize) -> Result<()> {
    use super::attention::{Expansion, a_int, a_ints, g_splice};
    let n = g.nodes[ni].clone();
    let c = Ctx { g, n: &n };
    let (xv, wv) = (c.input(0)?, c.input(1)?);
    let (xs, ws) = (xv.shape.clone(), wv.shape.clone());
    let dtype = xv.dtype;
    if ws.len() != 5 {
        return Err(c.mismatch(format!("ConvTranspose of {xs:?} with weights {ws:?}")));
    }
    let group = n.attr_i("group", 1)?;
    let gr = usize::try_from(group).unwrap_or(0);
    if gr < 1 || xs[1] % gr != 0 || ws[0] != xs[1] {
        return Err(c.mismatch(format!(
            "weights {ws:?} for {} input channels in {group} groups",
            xs[1]
        )));
    }
    let p = conv_transpose_params(&c, &xs[2..], ws[2..].to_vec())?;
    let bias = c.opt(2).map(|_| n.inputs[2].expect("present"));
    let Some(y) = n.outputs.first().copied().flatten() else {
        return Err(c.bad_attr("the output Y is required"));
    };
    let (nb, cin, id) = (xs[0], xs[1], xs[2]);
    let (og, kd, kh, kw) = (ws[1], ws[2], ws[3], ws[4]);
    let o = og * gr;
    let (od, oh, ow) = (p.out[0], p.out[1], p.out[2]);
    // The 2-D pads of H and W, from the equivalent convolution's: begin = d·(k−1) − cb;
    // end − output_padding = d·(k−1) − ce.
    let ext = |i: usize| (p.dilations[i] * (ws[2 + i] - 1)) as i64;
    let mut pads = vec![0i64; 4];
    let mut out_pad = vec![0i64; 2];
    for (j, i) in [1usize, 2].into_iter().enumerate() {
        pads[j] = ext(i) - p.conv_pad_begin[i];
        let end = ext(i) - p.conv_pad_end[i];
        if end >= 0 {
            pads[2 + j] = end;
        } else {
            out_pad[j] = -end;
        }
    }
    let depth_begin = ext(0) - p.conv_pad_begin[0];
    let (sd, dd) = (p.strides[0] as i64, p.dilations[0] as i64);
    crate::tensor::budget("the depth placement matrix", &[od, id, kd], dtype)
        .map_err(|e| e.at_node(&n.name, &n.op))?;
    let place = crate::tensor::HostTensor::from_f64s(
        dtype,
        vec![od, id * kd],
        (0..od).flat_map(|d| {
            (0..id * kd).map(move |ik| {
                let (i, k) = ((ik / kd) as i64, (ik % kd) as i64);
                f64::from(u8::from(i * sd + k * dd - depth_begin == d as i64))
            })
        }),
    );
    let x_in = n.inputs[0].expect("present");
    let w_in = n.inputs[1].expect("present");
    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let i = |v: usize| v as i64;
    let perm = a_ints("perm", &[0, 2, 1, 3, 4]);
    let xt = e.node("Transpose", &[x_in], vec![perm.clone()], None);
    let shape = e.ints("slices", &[i(nb * id), i(cin), i(xs[3]), i(xs[4])]);
    let x2 = e.node("Reshape", &[xt, shape], vec![], None);
    let wt = e.node("Transpose", &[w_in], vec![perm.clone()], None);
    let shape = e.ints("kernel", &[i(cin), i(kd * og), i(kh), i(kw)]);
    let w2 = e.node("Reshape", &[wt, shape], vec![], None);
    let attrs = vec![
        a_int("group", group),
        a_ints("kernel_shape", &[i(kh), i(kw)]),
        a_ints("strides", &[i(p.strides[1]), i(p.strides[2])]),
        a_ints("dilations", &[i(p.dilations[1]), i(p.dilations[2])]),
        a_ints("pads", &pads),
        a_ints("output_padding", &out_pad),
    ];
    let z = e.node("ConvTranspose", &[x2, w2], attrs, None);
    // [N·D, g·KD·O/g, OH, OW] → [N, D·KD, O·OH·OW] (kernel depth before group).
    let z = if gr > 1 {
        let shape = e.ints("groups", &[i(nb), i(id), group, i(kd), i(og), i(oh * ow)]);
        let z6 = e.node("Reshape", &[z, shape], vec![], None);
        e.node(
            "Transpose",
            &[z6],
            vec![a_ints("perm", &[0, 1, 3, 2, 4, 5])],
            None,
        )
    } else {
        z
    };
    let shape = e.ints("planes", &[i(nb), i(id * kd), i(o * oh * ow)]);
    let zr = e.node("Reshape", &[z, shape], vec![], None);
    let m = e.konst("placement", place);
    let y3 = e.node("MatMul", &[m, zr], vec![], None);
    let shape = e.ints("depths", &[i(nb), i(od), i(o), i(oh), i(ow)]);
    let y5 = e.node("Reshape", &[y3, shape], vec![], None);
    match bias {
        Some(b) => {
            let yt = e.node("Transpose", &[y5], vec![perm], None);
            let shape = e.ints("bias", &[i(o), 1, 1, 1]);
            let br = e.node("Reshape", &[b, shape], vec![], None);
            e.node("Add", &[yt, br], vec![], Some(y));
        }
        None => {
            e.node("Transpose", &[y5], vec![perm], Some(y));
        }
    }
    let nodes = std::mem::take(&mut e.nodes);
    g_splice(e.g, ni, nodes);
    Ok(())
}

/// Replaces the 3-D `Conv` node `ni` (X `[N, C, D, H, W]`, W `[O, C/g, KD, KH, KW]`) by
/// nodes the device computes. Output depth `od` reads the input depths
/// `od·s + kd·d − pad` (`kd` < KD) of the depth-padded input; a Gather on the padded depth
/// axis collects those `KD` slices for every output depth (`[N, C, OD·KD, H, W]`), a
/// Transpose/Reshape makes them the channels of a 2-D batch (`[N·OD, C·KD, H, W]`, channel
/// `c·KD + kd`, so each group's channels stay contiguous), and one 2-D Conv with W as
/// `[O, (C/g)·KD, KH, KW]` — same channel order — and the bias computes every output depth
/// slice at once. H and W keep their strides, dilations and pads (auto_pad resolved by
/// `window_params` over all three axes).
fn expand_conv_3d(g: &mut crate::graph::Graph, ni: usize) -> Result<()> {
    use super::attention::{Expansion, a_int, a_ints, g_splice};
    let n = g.nodes[ni].clone();
    let c = Ctx { g, n: &n };
    let (xv, wv) = (c.input(0)?, c.input(1)?);
    let (xs, ws) = (xv.shape.clone(), wv.shape.clone());
    let dtype = xv.dtype;
    if ws.len() != 5 {
        return Err(c.mismatch(format!("Conv of {xs:?} with weights {ws:?}")));
    }
    let group = n.attr_i("group", 1)?;
    let gr = usize::try_from(group).unwrap_or(0);
    if gr < 1 || xs[1] % gr != 0 || ws[0] % gr != 0 {
        return Err(c.bad_attr(format!("group {group}")));
    }
    if ws[1].checked_mul(gr) != Some(xs[1]) {
        return Err(c.mismatch(format!(
            "weights {ws:?} for {} input channels in {group} groups",
            xs[1]
        )));
    }
    let kernel: Vec<usize> = ws[2..].to_vec();
    if let Some(ks) = n.attr_ints("kernel_shape")?
        && ks.iter().map(|&k| k as usize).collect::<Vec<_>>() != kernel
    {
        return Err(c.mismatch(format!("kernel_shape {ks:?} but weights {ws:?}")));
    }
    let bias = c
        .opt(2)
        .map(|b| (b.elements(), n.inputs[2].expect("present")));
    if let Some((len, _)) = bias
        && len != ws[0]
    {
        return Err(c.mismatch(format!("bias of {len} for {} channels", ws[0])));
    }
    let p = window_params(&c, &xs[2..], kernel, false)?;
    let Some(y) = n.outputs.first().copied().flatten() else {
        return Err(c.bad_attr("the output Y is required"));
    };
    let (nb, cin, h, w) = (xs[0], xs[1], xs[3], xs[4]);
    let (o, cg, kd, kh, kw) = (ws[0], ws[1], ws[2], ws[3], ws[4]);
    let (od, oh, ow) = (p.out[0], p.out[1], p.out[2]);
    // The gathered input is KD·OD/D times the input; keep it inside the tensor budget.
    crate::tensor::budget("the gathered depth slices", &[nb, cin, od, kd, h, w], dtype)
        .map_err(|e| e.at_node(&n.name, &n.op))?;
    let (sd, dd) = (p.strides[0], p.dilations[0]);
    let idx: Vec<i64> = (0..od)
        .flat_map(|d| (0..kd).map(move |k| (d * sd + k * dd) as i64))
        .collect();
    let x_in = n.inputs[0].expect("present");
    let w_in = n.inputs[1].expect("present");
    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let i = |v: usize| v as i64;
    let xp = if p.pad_begin[0] + p.pad_end[0] > 0 {
        let pads = e.ints(
            "depth_pads",
            &[0, 0, i(p.pad_begin[0]), 0, 0, 0, 0, i(p.pad_end[0]), 0, 0],
        );
        e.node("Pad", &[x_in, pads], vec![], None)
    } else {
        x_in
    };
    let idx = e.ints("depth_taps", &idx);
    let xg = e.node("Gather", &[xp, idx], vec![a_int("axis", 2)], None);
    let shape = e.ints("taps", &[i(nb), i(cin), i(od), i(kd), i(h * w)]);
    let x5 = e.node("Reshape", &[xg, shape], vec![], None);
    let xt = e.node(
        "Transpose",
        &[x5],
        vec![a_ints("perm", &[0, 2, 1, 3, 4])],
        None,
    );
    let shape = e.ints("slices", &[i(nb * od), i(cin * kd), i(h), i(w)]);
    let x2 = e.node("Reshape", &[xt, shape], vec![], None);
    let shape = e.ints("kernel", &[i(o), i(cg * kd), i(kh), i(kw)]);
    let w2 = e.node("Reshape", &[w_in, shape], vec![], None);
    let attrs = vec![
        a_int("group", group),
        a_ints("kernel_shape", &[i(kh), i(kw)]),
        a_ints("strides", &[i(p.strides[1]), i(p.strides[2])]),
        a_ints("dilations", &[i(p.dilations[1]), i(p.dilations[2])]),
        a_ints(
            "pads",
            &[
                i(p.pad_begin[1]),
                i(p.pad_begin[2]),
                i(p.pad_end[1]),
                i(p.pad_end[2]),
            ],
        ),
    ];
    let mut ins = vec![x2, w2];
    ins.extend(bias.map(|(_, b)| b));
    let z = e.node("Conv", &ins, attrs, None);
    // [N·OD, O, OH, OW] → [N, O, OD, OH, OW].
    let shape = e.ints("depths", &[i(nb), i(od), i(o), i(oh * ow)]);
    let z4 = e.node("Reshape", &[z, shape], vec![], None);
    let zt = e.node(
        "Transpose",
        &[z4],
        vec![a_ints("perm", &[0, 2, 1, 3])],
        None,
    );
    let shape = e.ints("output", &[i(nb), i(o), i(od), i(oh), i(ow)]);
    e.node("Reshape", &[zt, shape], vec![], Some(y));
    let nodes = std::mem::take(&mut e.nodes);
    g_splice(e.g, ni, nodes);
    Ok(())
}

/// Col2Im geometry: image dims, block dims, strides, dilations, begin pads, padded image
/// dims and the number of blocks per dimension.
struct Col2Im {
    image: Vec<usize>,
    block: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pad_begin: Vec<usize>,
    padded: Vec<usize>,
    blocks: Vec<usize>,
}

fn col2im_params(c: &Ctx) -> Result<Col2Im> {
    let n = c.n;
    let x = c.input(0)?;
    let dims = |i: usize, what: &str| -> Result<Vec<usize>> {
        let v = c
            .const_ints(i, what)?
            .ok_or_else(|| c.bad_attr(format!("missing {what}")))?;
        v.iter()
            .map(|&d| {
                usize::try_from(d)
                    .ok()
                    .filter(|&d| d >= 1 && d <= params::MAX_WINDOW_ATTR as usize)
            })
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| c.bad_attr(format!("{what} {v:?}")))
    };
    let image = dims(1, "image_shape")?;
    let block = dims(2, "block_shape")?;
    let k = image.len();
    if block.len() != k || k == 0 || x.shape.len() != 3 {
        return Err(c.mismatch(format!(
            "input {:?}, image_shape {image:?}, block_shape {block:?}",
            x.shape
        )));
    }
    let attr = |name: &str, default: usize, len: usize| -> Result<Vec<usize>> {
        match n.attr_ints(name)? {
            None => Ok(vec![default; len]),
            Some(v) if v.len() == len => v
                .iter()
                .map(|&d| {
                    usize::try_from(d)
                        .ok()
                        .filter(|&d| d <= params::MAX_WINDOW_ATTR as usize)
                })
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| c.bad_attr(format!("{name} {v:?}"))),
            Some(v) => Err(c.bad_attr(format!("{name} {v:?}"))),
        }
    };
    let strides = attr("strides", 1, k)?;
    let dilations = attr("dilations", 1, k)?;
    let pads = attr("pads", 0, 2 * k)?;
    if strides.contains(&0) || dilations.contains(&0) {
        return Err(c.bad_attr("zero stride or dilation"));
    }
    let mut padded = Vec::new();
    let mut blocks = Vec::new();
    for d in 0..k {
        let p = image[d] + pads[d] + pads[k + d];
        let span = dilations[d] * (block[d] - 1) + 1;
        if p < span {
            return Err(c.mismatch(format!("block {block:?} larger than the padded image")));
        }
        padded.push(p);
        blocks.push((p - span) / strides[d] + 1);
    }
    let bprod: usize = block.iter().product();
    let lprod: usize = blocks.iter().product();
    if x.shape[1] % bprod != 0 || x.shape[2] != lprod {
        return Err(c.mismatch(format!(
            "input {:?} for blocks {block:?} at {blocks:?} positions",
            x.shape
        )));
    }
    Ok(Col2Im {
        image,
        block,
        strides,
        dilations,
        pad_begin: pads[..k].to_vec(),
        padded,
        blocks,
    })
}

/// Col2Im: `[N, C, image…]` with `C = input.shape[1] / Π block`.
pub(crate) fn infer_col2im(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let p = col2im_params(c)?;
    let bprod: usize = p.block.iter().product();
    let mut s = vec![x.shape[0], x.shape[1] / bprod];
    s.extend(&p.image);
    Ok(vec![out(x.dtype, s)])
}

impl<'a> Lowerer<'a> {
    /// Col2Im: a zeroed padded image; for each block offset the input's columns of that
    /// offset (`[N, C, blocks…]`) are added into the image's strided view at that offset;
    /// the interior is copied out.
    pub(crate) fn lower_col2im(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let p = col2im_params(&c)?;
        let k = p.image.len();
        let bprod: usize = p.block.iter().product();
        let (nb, ch) = (xv.shape[0], xv.shape[1] / bprod);
        let y = self.alloc(o0);
        if nb * ch == 0 {
            return Ok(());
        }
        let mut pshape = vec![nb, ch];
        pshape.extend(&p.padded);
        let pn = crate::tensor::budget("Col2Im padded image", &pshape, DType::F32)
            .map_err(|e| e.at_node(&n.name, &n.op))?;
        let img = View::dense(self.temp(pn * 4), DType::F32, &pshape);
        self.fill(Engine::Dve, &img, 0.0)?;
        let x = self.input_view(n, 0)?;
        let mut xs = vec![nb, ch, bprod];
        xs.extend(&p.blocks);
        let xr = match x.reshape(&xs) {
            Some(v) => v,
            None => {
                let t = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
                self.copy(Engine::Dve, &x, &t)?;
                View::dense(t.addr, DType::F32, &xs)
            }
        };
        for b in 0..bprod {
            let src = xr.slice(2, b as i64, 1, 1);
            let mut sshape = vec![nb, ch];
            sshape.extend(&p.blocks);
            let mut st = src.strides.clone();
            st.remove(2);
            let src = View {
                shape: sshape,
                strides: st,
                ..src
            };
            let mut dst = img.clone();
            let mut rem = b;
            for d in (0..k).rev() {
                let off = rem % p.block[d];
                rem /= p.block[d];
                dst = dst.slice(
                    2 + d,
                    (off * p.dilations[d]) as i64,
                    p.blocks[d],
                    p.strides[d] as i64,
                );
            }
            self.binary(&dst, &src, &dst, nrt_isa::BinaryOp::Add)?;
        }
        let mut inner = img;
        for d in 0..k {
            inner = inner.slice(2 + d, p.pad_begin[d] as i64, p.image[d], 1);
        }
        self.copy(Engine::Dve, &inner, &y)
    }

    /// Emits a Conv over `[N, C, H, W]` views, split by output channels (or groups) on 2 cores.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn conv_op(
        &mut self,
        x: AccessPattern,
        w: AccessPattern,
        y: AccessPattern,
        bias: Option<AccessPattern>,
        window: Window,
        groups: u32,
        act: (ActFunc, f32, f32),
    ) {
        let o = w.shape[0];
        let split_groups = groups > 1 && groups.is_multiple_of(2);
        if self.cores < 2 || (groups == 1 && o < 2) || (groups > 1 && !split_groups) {
            let workspace = self.conv_workspace(&x, &w, &y, &window, groups);
            self.emit(
                0,
                Engine::Pe,
                Op::Conv(op::Conv {
                    input: x,
                    weight: w,
                    output: y,
                    bias,
                    workspace,
                    window,
                    groups,
                    act,
                }),
            );
            return;
        }
        let adv = |ap: &AccessPattern, dim: usize, start: u32, len: u32| {
            let mut a = *ap;
            a.shape[dim] = len;
            a.addr = (a.addr as i64 + start as i64 * a.stride[dim] as i64 * 4) as u64;
            a
        };
        let (o0, g0) = if split_groups {
            (o / 2, groups / 2)
        } else {
            (o / 2, 1)
        };
        let c0 = x.shape[1] / 2;
        // One scratch block for both cores, each its own half: they convolve at the same
        // time (two temporaries would each be live for one instruction only, and the
        // planner could overlap them).
        let mut scratch: Option<(u64, u64)> = None;
        for (core, first) in [(0u8, true), (1u8, false)] {
            let (os, ol) = if first { (0, o0) } else { (o0, o - o0) };
            let w2 = adv(&w, 0, os, ol);
            let y2 = adv(&y, 1, os, ol);
            let b2 = bias.map(|b| adv(&b, 3, os, ol));
            let (x2, g2) = if split_groups {
                let (cs, cl) = if first {
                    (0, c0)
                } else {
                    (c0, x.shape[1] - c0)
                };
                (adv(&x, 1, cs, cl), if first { g0 } else { groups - g0 })
            } else {
                (x, 1)
            };
            let workspace = match self.conv_workspace_len(&x2, &w2, &y2, &window, g2) {
                None => None,
                Some(len) => {
                    // (The halves have equal channels per group, so equal patch matrices.)
                    let bytes = (u64::from(len) * 4).next_multiple_of(64);
                    let at = match scratch {
                        Some((base, half)) if bytes <= half => base + half,
                        _ => {
                            let base = self.temp(2 * bytes as usize);
                            scratch = Some((base, bytes));
                            base
                        }
                    };
                    mk_ap(at, DType::F32, &[len as usize], &[1]).ok()
                }
            };
            self.emit(
                core,
                Engine::Pe,
                Op::Conv(op::Conv {
                    input: x2,
                    weight: w2,
                    output: y2,
                    bias: b2,
                    workspace,
                    window,
                    groups: g2,
                    act,
                }),
            );
        }
    }

    /// Scratch (from the arena) for the engine's im2col + GEMM convolution: the patch matrix
    /// `(C/g)·KH·KW × OH·OW` (the engine fills it a cache-sized band at a time, so only the
    /// first band's pages are touched). Not for pointwise convolutions (the input already is
    /// that matrix) or one output channel per group (depthwise: a GEMM of one row, the
    /// engine convolves directly). Measured on this project's machine (conv + relu, batch 1):
    /// 3→16 ch 32² 3×3 53 → 33 µs; 16→32 ch 16² 3×3 stride 2 264 → 25 µs; 64→64 ch 56²
    /// 12.0 → 4.1 ms; 3→64 ch 224² 7×7 stride 2 70 → 5.8 ms; 256→512 1×1 stride 2 62 →
    /// 3.7 ms: im2col wins at every size tried.
    pub(crate) fn conv_workspace(
        &mut self,
        x: &AccessPattern,
        w: &AccessPattern,
        y: &AccessPattern,
        window: &Window,
        groups: u32,
    ) -> Option<AccessPattern> {
        let len = self.conv_workspace_len(x, w, y, window, groups)?;
        let addr = self.temp(len as usize * 4);
        mk_ap(addr, DType::F32, &[len as usize], &[1]).ok()
    }

    /// Elements of [`Self::conv_workspace`]'s scratch, `None` when the convolution goes
    /// without.
    pub(crate) fn conv_workspace_len(
        &self,
        x: &AccessPattern,
        w: &AccessPattern,
        y: &AccessPattern,
        window: &Window,
        groups: u32,
    ) -> Option<u32> {
        let g = groups.max(1) as u64;
        let (og, cg) = (w.shape[0] as u64 / g, x.shape[1] as u64 / g);
        let (kh, kw) = (w.shape[2] as u64, w.shape[3] as u64);
        let kk = cg * kh * kw;
        let pointwise = kh == 1 && kw == 1 && window.stride == [1, 1] && window.pad == [0; 4];
        if pointwise || og < 2 || kk == 0 {
            return None;
        }
        u32::try_from(kk * y.shape[2] as u64 * y.shape[3] as u64).ok()
    }

    pub(crate) fn lower_conv(&mut self, at: At<'a>) -> Result<()> {
        let At { g, n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let wv = c.input(1)?;
        let group = n.attr_i("group", 1)? as u32;
        let p = params::window_params(&c, &xv.shape[2..], wv.shape[2..].to_vec(), false)?;
        let x = self.input_view(n, 0)?;
        // A BatchNormalization that only this convolution feeds folds into its constant
        // weights and bias: w'[o] = w[o]·scale[o], b'[o] = b[o]·scale[o] + shift[o].
        let bn = self.sole_consumer(o0).filter(|&j| {
            g.nodes[j].op == "BatchNormalization"
                && !self.skip[j]
                && c.konst(1).is_some()
                && n.inputs
                    .get(2)
                    .copied()
                    .flatten()
                    .is_none_or(|_| c.konst(2).is_some())
        });
        let folded = match bn {
            Some(j) => {
                let cj = Ctx { g, n: &g.nodes[j] };
                let (scale, shift) = bn_affine(&cj)?;
                let wt = c.konst(1).expect("checked");
                let o = wv.shape[0];
                if scale.len() != o {
                    return Err(c.e(ErrorKind::ShapeMismatch, "BatchNormalization channels"));
                }
                let per = wv.elements() / o.max(1);
                let mut wf = wt.to_f32s().into_owned();
                for (i, v) in wf.iter_mut().enumerate() {
                    *v *= scale[i / per];
                }
                let b0 = c
                    .konst(2)
                    .map_or(vec![0.0; o], |t| t.to_f32s().into_owned());
                let bf: Vec<f32> = (0..o).map(|i| b0[i] * scale[i] + shift[i]).collect();
                let wa = self.add_const(&HostTensor::f32(wv.shape.clone(), wf))?;
                let ba = self.add_const(&HostTensor::f32(vec![o], bf))?;
                self.skip[j] = true;
                Some((
                    j,
                    View::dense(wa, DType::F32, &wv.shape),
                    View::dense(ba, DType::F32, &[o]),
                ))
            }
            None => None,
        };
        let (w, bias, target) = match folded {
            Some((j, w, b)) => (w, Some(b), self.out(j, 0)?),
            None => (
                self.input_view(n, 1)?,
                match n.inputs.get(2).copied().flatten() {
                    Some(b) => Some(self.view(b)?),
                    None => None,
                },
                o0,
            ),
        };
        // An activation that only this convolution (or its folded batch norm) feeds is
        // applied by the convolution itself, row band by row band while the output is in
        // cache (Conv + BN + Relu in one instruction).
        // Not when the activation writes a strided part of a Concat in place (the
        // convolution writes dense outputs only: the part would then cost a copy instead).
        let act = self.sole_consumer(target).and_then(|j| {
            let cj = Ctx { g, n: &g.nodes[j] };
            let f = super::unary::act_of(&cj).ok().flatten()?;
            let o = g.nodes[j].outputs.first().copied().flatten()?;
            let strided_part = self
                .concat_of(o)
                .is_some_and(|(_, _, axis, _)| g.values[o].shape[..axis].iter().any(|&d| d > 1));
            (!self.skip[j]
                && !strided_part
                && !self.fused.contains_key(&j)
                && g.nodes[j].inputs.first().copied().flatten() == Some(target)
                && g.values[o].shape == g.values[target].shape
                && g.values[o].dtype == DType::F32)
                .then_some((j, o, f))
        });
        let (target, act) = match act {
            Some((j, o, f)) => {
                self.skip[j] = true;
                (o, f)
            }
            None => (target, NO_ACT),
        };
        let y = self.alloc(target);
        if y.shape.contains(&0) {
            return self.finish_fused_target(target, o0);
        }
        let to4 = |s: &[usize]| -> Vec<usize> {
            if s.len() == 3 {
                vec![s[0], s[1], 1, s[2]]
            } else {
                s.to_vec()
            }
        };
        let two = |v: &[usize], d: usize| -> [u32; 2] {
            if v.len() == 1 {
                [d as u32, v[0] as u32]
            } else {
                [v[0] as u32, v[1] as u32]
            }
        };
        let (xs, ws, ys) = (to4(&x.shape), to4(&w.shape), to4(&y.shape));
        let xa = mk_ap(x.addr, x.dtype, &xs, &dense_strides(&xs))?;
        let wa = mk_ap(w.addr, w.dtype, &ws, &dense_strides(&ws))?;
        let ya = mk_ap(y.addr, y.dtype, &ys, &dense_strides(&ys))?;
        let ba = match &bias {
            Some(b) => Some(mk_ap(b.addr, b.dtype, &[b.shape.iter().product()], &[1])?),
            None => None,
        };
        let pb = two(&p.pad_begin, 0);
        let pe = two(&p.pad_end, 0);
        let window = Window {
            kernel: [0, 0],
            stride: two(&p.strides, 1),
            pad: [pb[0], pb[1], pe[0], pe[1]],
            dilation: two(&p.dilations, 1),
        };
        self.conv_op(xa, wa, ya, ba, window, group, act);
        self.finish_fused_target(target, o0)
    }

    pub(crate) fn lower_conv_transpose(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let wv = c.input(1)?;
        let group = n.attr_i("group", 1)? as usize;
        let p = params::conv_transpose_params(&c, &xv.shape[2..], wv.shape[2..].to_vec())?;
        if p.conv_pad_begin
            .iter()
            .chain(&p.conv_pad_end)
            .any(|&v| v < 0)
        {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                "ConvTranspose whose pads exceed the kernel extent (negative equivalent padding)",
            ));
        }
        let to4 = |s: &[usize]| -> Vec<usize> {
            if s.len() == 3 {
                vec![s[0], s[1], 1, s[2]]
            } else {
                s.to_vec()
            }
        };
        let xs = to4(&xv.shape);
        let ws = to4(&wv.shape); // [C, O/g, kh, kw]
        let sp = if p.strides.len() == 1 {
            vec![1, p.strides[0]]
        } else {
            p.strides.clone()
        };
        let dl = if p.dilations.len() == 1 {
            vec![1, p.dilations[0]]
        } else {
            p.dilations.clone()
        };
        let (pb, pe): (Vec<i64>, Vec<i64>) = if p.conv_pad_begin.len() == 1 {
            (vec![0, p.conv_pad_begin[0]], vec![0, p.conv_pad_end[0]])
        } else {
            (p.conv_pad_begin.clone(), p.conv_pad_end.clone())
        };
        let x = self.input_view(n, 0)?;
        let x4 = View::dense(x.addr, x.dtype, &xs);
        // 1. Zero-insert the input when strided.
        let xz = if sp.iter().all(|&s| s == 1) {
            x4
        } else {
            let zs = vec![
                xs[0],
                xs[1],
                (xs[2] - 1) * sp[0] + 1,
                (xs[3] - 1) * sp[1] + 1,
            ];
            let bytes = zs.iter().product::<usize>() * 4;
            let t = View::dense(self.temp(bytes), DType::F32, &zs);
            self.fill(Engine::Pool, &t, 0.0)?;
            let mut dst = t.clone();
            dst.shape = xs.clone();
            dst.strides[2] *= sp[0] as i64;
            dst.strides[3] *= sp[1] as i64;
            self.copy(Engine::Pool, &x4, &dst)?;
            t
        };
        // 2. Weights [C, O/g, kh, kw] → [O, C/g, kh, kw], flipped spatially.
        let (cin, og, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
        let cg = cin / group;
        let o = og * group;
        let wshape = vec![o, cg, kh, kw];
        let waddr = if let Some(t) = c.konst(1) {
            let src = t.to_f32s();
            let mut dst = vec![0f32; o * cg * kh * kw];
            for gi in 0..group {
                for oo in 0..og {
                    for cc in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let s = (((gi * cg + cc) * og + oo) * kh + (kh - 1 - i)) * kw
                                    + (kw - 1 - j);
                                let d = (((gi * og + oo) * cg + cc) * kh + i) * kw + j;
                                dst[d] = src[s];
                            }
                        }
                    }
                }
            }
            self.add_const(&HostTensor::f32(wshape.clone(), dst))?
        } else {
            let w = self.input_view(n, 1)?;
            let t = View::dense(self.temp(o * cg * kh * kw * 4), DType::F32, &wshape);
            for gi in 0..group {
                // src[o', c', i, j] = W[gi*cg + c', o', kh-1-i, kw-1-j]
                let base = ((gi * cg * og) * kh * kw + (kh - 1) * kw + (kw - 1)) as i64;
                let src = View {
                    addr: w.elems(base),
                    dtype: w.dtype,
                    shape: vec![og, cg, kh, kw],
                    strides: vec![(kh * kw) as i64, (og * kh * kw) as i64, -(kw as i64), -1],
                };
                let dst = View::dense(
                    t.elems((gi * og * cg * kh * kw) as i64),
                    DType::F32,
                    &[og, cg, kh, kw],
                );
                self.copy(Engine::Pool, &src, &dst)?;
            }
            t.addr
        };
        let bias = match n.inputs.get(2).copied().flatten() {
            Some(b) => Some(self.view(b)?),
            None => None,
        };
        let y = self.alloc(o0);
        let ys = to4(&y.shape);
        if ys.contains(&0) {
            return Ok(());
        }
        let xa = xz.ap()?;
        let wa = mk_ap(waddr, DType::F32, &wshape, &dense_strides(&wshape))?;
        let ya = mk_ap(y.addr, y.dtype, &ys, &dense_strides(&ys))?;
        let ba = match &bias {
            Some(b) => Some(mk_ap(b.addr, b.dtype, &[o], &[1])?),
            None => None,
        };
        let window = Window {
            kernel: [0, 0],
            stride: [1, 1],
            pad: [pb[0] as u32, pb[1] as u32, pe[0] as u32, pe[1] as u32],
            dilation: [dl[0] as u32, dl[1] as u32],
        };
        self.conv_op(xa, wa, ya, ba, window, group as u32, NO_ACT);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, a_ints, infer_one, konst, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    fn f(s: &[usize]) -> Option<crate::eval::testing::Arg> {
        var(DType::F32, s)
    }

    #[test]
    fn conv_and_conv_transpose_output_shapes() {
        let attrs = vec![
            a_i("group", 2),
            a_ints("strides", &[2, 2]),
            a_ints("pads", &[1, 1, 1, 1]),
        ];
        let ins = vec![f(&[1, 4, 8, 8]), f(&[6, 2, 3, 3])];
        let t = out_types("Conv", 11, ins, attrs, 1);
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![1, 6, 4, 4])]);
        let ins = vec![f(&[1, 2, 3, 3]), f(&[2, 3, 3, 3])];
        let st = vec![a_ints("strides", &[2, 2])];
        let t = out_types("ConvTranspose", 11, ins, st, 1);
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![1, 3, 7, 7])]);
        let ins = vec![f(&[1, 4, 8, 8]), f(&[6, 2, 3, 3])];
        let e = out_types("Conv", 11, ins, vec![a_i("group", 3)], 1).unwrap_err();
        assert!(e.message.contains("group 3"), "{e}");
    }

    #[test]
    fn a_3d_conv_becomes_2d_convs() {
        let ins = vec![f(&[1, 2, 4, 4, 4]), f(&[3, 2, 3, 3, 3])];
        let g = infer_one("Conv", 11, ins, vec![], 1).unwrap();
        let y = &g.values[g.outputs[0]];
        assert_eq!(y.shape, vec![1, 3, 2, 2, 2]);
        let convs: Vec<_> = g.nodes.iter().filter(|n| n.op == "Conv").collect();
        assert!(!convs.is_empty());
        for n in convs {
            let x = n.inputs[0].unwrap();
            assert_eq!(g.values[x].shape.len(), 4, "{}", n.name);
        }
    }

    #[test]
    fn col2im_folds_blocks_into_the_image() {
        let dims = |v: &[i64]| konst(HostTensor::i64(vec![2], v.to_vec()));
        let ins = vec![f(&[1, 8, 9]), dims(&[4, 4]), dims(&[2, 2])];
        let t = out_types("Col2Im", 18, ins, vec![], 1).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![1, 2, 4, 4])]);
        let ins = vec![f(&[1, 8, 8]), dims(&[4, 4]), dims(&[2, 2])];
        let e = out_types("Col2Im", 18, ins, vec![], 1).unwrap_err();
        assert!(e.message.contains("at [3, 3] positions"), "{e}");
    }
}
