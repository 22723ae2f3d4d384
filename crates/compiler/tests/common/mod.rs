//! Helpers that build small ONNX models with the compiler's own prost messages.
#![allow(dead_code)]

pub mod e2e;
pub mod fusion;

use nrt_compiler::onnx::*;

pub fn node(op: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: format!("{op}_{}", outs.first().copied().unwrap_or("")),
        op_type: op.to_string(),
        attribute: attrs,
        ..Default::default()
    }
}

pub fn a_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i: v,
        ..Default::default()
    }
}

pub fn a_f(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::FLOAT,
        f: v,
        ..Default::default()
    }
}

pub fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub fn a_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| {
                            if d == -1 {
                                Dimension {
                                    dim_value: None,
                                    dim_param: Some("batch".into()),
                                }
                            } else {
                                Dimension {
                                    dim_value: Some(d),
                                    dim_param: None,
                                }
                            }
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
    }
}

pub fn f32_init(name: &str, dims: &[i64], vals: Vec<f32>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        float_data: vals,
        ..Default::default()
    }
}

pub fn i64_init(name: &str, dims: &[i64], vals: Vec<i64>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::INT64,
        int64_data: vals,
        ..Default::default()
    }
}

pub fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 97) as f32 * scale - 0.5)
        .collect()
}

pub fn model(
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    opset: i64,
) -> Vec<u8> {
    encode_model(&ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        producer_name: "test".into(),
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: inits,
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// An MLP: `layers × (MatMul + Add + Relu)` of `width`, batch `batch`.
pub fn mlp(batch: i64, width: i64, layers: usize) -> Vec<u8> {
    let mut nodes = Vec::new();
    let mut inits = Vec::new();
    let mut cur = "X".to_string();
    for i in 0..layers {
        let w = format!("W{i}");
        let b = format!("b{i}");
        inits.push(f32_init(
            &w,
            &[width, width],
            ramp((width * width) as usize, 0.01),
        ));
        inits.push(f32_init(&b, &[width], ramp(width as usize, 0.1)));
        let mm = format!("mm{i}");
        let add = format!("add{i}");
        let out = if i + 1 == layers {
            "Y".to_string()
        } else {
            format!("h{i}")
        };
        nodes.push(node("MatMul", &[&cur, &w], &[&mm], vec![]));
        nodes.push(node("Add", &[&mm, &b], &[&add], vec![]));
        nodes.push(node("Relu", &[&add], &[&out], vec![]));
        cur = out;
    }
    model(
        nodes,
        inits,
        vec![vi("X", data_type::FLOAT, &[batch, width])],
        vec![vi("Y", data_type::FLOAT, &[batch, width])],
        17,
    )
}
