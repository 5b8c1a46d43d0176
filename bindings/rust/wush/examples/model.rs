//! A small model end to end on libwush's runtime: load a checkpoint written by `wush quantize`,
//! prepare its layers once, run tokens through them (fc1, ReLU, fc2) and compare with the
//! float64 formula on the original weights.
//!
//!     python3 bindings/examples/tiny_model.py DIR
//!     wush quantize --weights DIR/weights.safetensors --activations DIR/activations.safetensors \
//!         --format mxfp4 --transform wush --out DIR/checkpoint.safetensors
//!     cargo run --offline --example model -- DIR/checkpoint.safetensors DIR/weights.safetensors \
//!         DIR/activations.safetensors
//!
//! Prints each layer's and the model's relative error ||y_q - y||_F / ||y||_F against float64,
//! and exits non-zero when the quantized model does not track the float one.

use std::process::ExitCode;
use wush::{Checkpoint, Context, Linear, TensorFile};

/// An F32 2-D tensor of a safetensors file, as (rows, cols, values).
fn tensor_f32(file: &TensorFile, name: &str) -> Result<(usize, usize, Vec<f32>), String> {
    let t = file.find(name).map_err(|e| e.to_string())?.ok_or(format!("no tensor {name}"))?;
    if t.dtype != "F32" || t.shape.len() != 2 {
        return Err(format!("{name}: expected a 2-D F32 tensor, got {} {:?}", t.dtype, t.shape));
    }
    let v = t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok((t.shape[0] as usize, t.shape[1] as usize, v))
}

/// y = x w^T in float64 (x: n x d_in, w: d_out x d_in).
fn matmul_t(x: &[f64], w: &[f32], d_in: usize, d_out: usize) -> Vec<f64> {
    let n = x.len() / d_in;
    let mut y = vec![0.0; n * d_out];
    for t in 0..n {
        for o in 0..d_out {
            y[t * d_out + o] = (0..d_in).map(|k| x[t * d_in + k] * w[o * d_in + k] as f64).sum();
        }
    }
    y
}

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

fn run(args: &[String]) -> Result<f64, String> {
    let [ck_path, w_path, x_path] = args else {
        return Err("usage: model CHECKPOINT WEIGHTS ACTIVATIONS".into());
    };
    let e = |e: wush::Error| e.to_string();
    let ctx = Context::cpu().map_err(e)?;
    println!("libwush {} on {}", wush::version_string(), ctx.describe().map_err(e)?);

    // Prepare every layer once. The checkpoint and the loaded transforms/qweights may go away
    // afterwards: a prepared layer keeps what it needs.
    let ck = Checkpoint::open(ck_path).map_err(e)?;
    let mut layers = Vec::new();
    for name in ["fc1", "fc2"] {
        let (t, q) = ck.load_layer(name).map_err(e)?;
        let info = q.info().map_err(e)?;
        println!("{name}: {} x {}, {} {}", info.d_out, info.d_in, info.format.name(),
                 t.info().map_err(e)?.0.name());
        layers.push(Linear::new(&ctx, &t, &q).map_err(e)?);
    }
    drop(ck);

    let weights = TensorFile::open(w_path).map_err(e)?;
    let (_, w1_in, w1) = tensor_f32(&weights, "fc1")?;
    let (w2_out, w2_in, w2) = tensor_f32(&weights, "fc2")?;
    let (_, _, x_all) = tensor_f32(&TensorFile::open(x_path).map_err(e)?, "fc1")?;
    let x = &x_all[..64 * w1_in]; // 64 tokens

    // Quantized path: fc1 -> ReLU -> fc2, each through its prepared layer (one workspace).
    let (d_hid, _, _) = layers[0].info();
    let n = x.len() / w1_in;
    let mut ws = vec![0u8; layers.iter().map(|l| l.workspace_size(n).unwrap_or(0)).max().unwrap_or(0)];
    let mut h = vec![0f32; n * d_hid];
    layers[0].run(x, &mut h, &mut ws).map_err(e)?;
    let h_relu: Vec<f32> = h.iter().map(|v| v.max(0.0)).collect();
    let mut y = vec![0f32; n * w2_out];
    layers[1].run(&h_relu, &mut y, &mut ws).map_err(e)?;

    // The float64 formula on the original weights.
    let x64: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    let h64 = matmul_t(&x64, &w1, w1_in, d_hid);
    let h64_relu: Vec<f64> = h64.iter().map(|v| v.max(0.0)).collect();
    let y64 = matmul_t(&h64_relu, &w2, w2_in, w2_out);
    let fc2_alone = matmul_t(&h_relu.iter().map(|v| *v as f64).collect::<Vec<_>>(), &w2, w2_in, w2_out);

    println!("fc1 relative error vs float64:              {:.4}", rel_err(&h_relu, &h64_relu));
    println!("fc2 relative error vs float64 (same input): {:.4}", rel_err(&y, &fc2_alone));
    let model = rel_err(&y, &y64);
    println!("model relative error vs float64:            {:.4}", model);
    Ok(model)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        // 4-bit weights and activations keep a model within several percent; a broken path
        // (wrong layout, wrong layer) gives errors near 1.
        Ok(err) if err < 0.25 => {
            println!("rust model example: OK");
            ExitCode::SUCCESS
        }
        Ok(err) => {
            eprintln!("rust model example: the quantized model is off by {err:.3}");
            ExitCode::FAILURE
        }
        Err(msg) => {
            eprintln!("rust model example: {msg}");
            ExitCode::FAILURE
        }
    }
}
