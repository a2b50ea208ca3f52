//! The CRDs a stand-in holds, and what they refuse, as the API server
//! refuses it: an object that does not fit the served version's schema,
//! or breaks one of its `x-kubernetes-validations` rules (CEL), evaluated
//! where the schema puts them, `oldSelf` against the stored object.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context, Result, bail};
use cel_interpreter::{Context as CelContext, Program, Value as Cel};
use serde_json::Value;

/// One step from a schema node to a child: a property, or every item.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Property(String),
    Items,
}

/// A rule of `x-kubernetes-validations`, at `path` in the object.
struct Rule {
    path: Vec<Step>,
    expression: String,
    message: String,
}

/// One CRD's served version: its kind, schema and rules.
struct Crd {
    kind: String,
    schema: jsonschema::Validator,
    rules: Vec<Rule>,
}

/// The CRDs, by plural.
#[derive(Default)]
pub struct Crds {
    by_plural: BTreeMap<String, Crd>,
}

impl Crds {
    /// The CRDs of `files`, each with the version it serves and stores.
    pub fn load(files: &[impl AsRef<Path>]) -> Result<Self> {
        let mut by_plural = BTreeMap::new();
        for file in files {
            let file = file.as_ref();
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let crd: Value = serde_yaml_ng::from_str(&text)
                .with_context(|| format!("parsing {}", file.display()))?;
            let plural = crd["spec"]["names"]["plural"]
                .as_str()
                .with_context(|| format!("{}: spec.names.plural", file.display()))?;
            by_plural.insert(plural.to_owned(), Crd::of(&crd, file)?);
        }
        Ok(Self { by_plural })
    }

    /// Why the API server would refuse `object` of `plural`, replacing
    /// `old` if any; None if it admits it, or holds no CRD for `plural`.
    pub fn refusal(&self, plural: &str, object: &Value, old: Option<&Value>) -> Option<String> {
        let crd = self.by_plural.get(plural)?;
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let problems: Vec<String> = crd
            .schema
            .iter_errors(object)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .chain(crd.rules.iter().flat_map(|rule| rule.broken(object, old)))
            .collect();
        (!problems.is_empty())
            .then(|| format!("{} {name:?} is invalid: {}", crd.kind, problems.join("; ")))
    }
}

impl Crd {
    fn of(crd: &Value, file: &Path) -> Result<Self> {
        let Some(version) = crd["spec"]["versions"]
            .as_array()
            .and_then(|versions| versions.iter().find(|v| v["storage"] == true))
        else {
            bail!("{}: no stored version", file.display());
        };
        let schema = &version["schema"]["openAPIV3Schema"];
        let mut rules = Vec::new();
        collect_rules(schema, &mut Vec::new(), &mut rules);
        Ok(Self {
            kind: crd["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            schema: jsonschema::draft4::new(schema)
                .map_err(|e| anyhow::anyhow!("{}: the schema: {e}", file.display()))?,
            rules,
        })
    }
}

/// Every rule under schema node `node`, at `path`.
fn collect_rules(node: &Value, path: &mut Vec<Step>, rules: &mut Vec<Rule>) {
    for rule in node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        rules.push(Rule {
            path: path.clone(),
            expression: rule["rule"].as_str().unwrap_or("true").to_owned(),
            message: rule["message"].as_str().unwrap_or("failed rule").to_owned(),
        });
    }
    if let Some(properties) = node["properties"].as_object() {
        for (name, child) in properties {
            path.push(Step::Property(name.clone()));
            collect_rules(child, path, rules);
            path.pop();
        }
    }
    if node["items"].is_object() {
        path.push(Step::Items);
        collect_rules(&node["items"], path, rules);
        path.pop();
    }
}

/// The values at `path` in `value`, each with its place as the API server
/// names it (`spec.endpoint.port`, `spec.cidr.pod[0]`).
fn values_at<'a>(value: &'a Value, path: &[Step], place: String) -> Vec<(String, &'a Value)> {
    let Some((step, rest)) = path.split_first() else {
        return vec![(place, value)];
    };
    match step {
        Step::Property(name) => match value.get(name) {
            Some(child) => {
                let place = match place.is_empty() {
                    true => name.clone(),
                    false => format!("{place}.{name}"),
                };
                values_at(child, rest, place)
            }
            None => Vec::new(),
        },
        Step::Items => value
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .flat_map(|(i, item)| values_at(item, rest, format!("{place}[{i}]")))
            .collect(),
    }
}

impl Rule {
    /// Where `object` breaks the rule, as the API server words it. A
    /// transition rule (one naming `oldSelf`) holds on creation, and where
    /// the old object had no value, as the API server has it.
    fn broken(&self, object: &Value, old: Option<&Value>) -> Vec<String> {
        let transition = self.expression.contains("oldSelf");
        let old_values: BTreeMap<String, &Value> = old
            .map(|old| values_at(old, &self.path, String::new()))
            .unwrap_or_default()
            .into_iter()
            .collect();
        values_at(object, &self.path, String::new())
            .into_iter()
            .filter_map(|(place, value)| {
                let old_value = old_values.get(&place).copied();
                if transition && old_value.is_none() {
                    return None;
                }
                match self.holds(value, old_value) {
                    Ok(true) => None,
                    Ok(false) => Some(format!("{place}: Invalid value: {}", self.message)),
                    Err(e) => Some(format!(
                        "{place}: rule {:?} cannot run: {e}",
                        self.expression
                    )),
                }
            })
            .collect()
    }

    fn holds(&self, value: &Value, old: Option<&Value>) -> Result<bool, String> {
        let program = Program::compile(&self.expression).map_err(|e| format!("{e:?}"))?;
        let mut context = CelContext::default();
        context
            .add_variable("self", value)
            .map_err(|e| format!("{e:?}"))?;
        if let Some(old) = old {
            context
                .add_variable("oldSelf", old)
                .map_err(|e| format!("{e:?}"))?;
        }
        match program.execute(&context) {
            Ok(Cel::Bool(holds)) => Ok(holds),
            Ok(other) => Err(format!("gives {other:?}, not a bool")),
            Err(e) => Err(format!("{e:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crds() -> Crds {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        Crds::load(&[
            root.join("tests/fixtures/liqo-v1/crds/ipam.liqo.io_ips.yaml"),
            root.join("manifests/liqo-v1/gateway-type/crds/gateway.isthmus.dev_isthmusgatewayservers.yaml"),
        ])
        .unwrap()
    }

    fn ip(spec_ip: &str) -> Value {
        json!({"apiVersion": "ipam.liqo.io/v1alpha1", "kind": "IP",
               "metadata": {"name": "db", "namespace": "default"},
               "spec": {"ip": spec_ip}})
    }

    #[test]
    fn a_schema_and_its_rules_refuse_what_the_api_server_refuses() {
        let crds = crds();
        assert_eq!(crds.refusal("ips", &ip("10.0.0.4"), None), None);
        // An immutable field, changed: the transition rule, by its path.
        let changed = crds
            .refusal("ips", &ip("10.0.0.5"), Some(&ip("10.0.0.4")))
            .unwrap();
        assert!(
            changed.contains("spec.ip: Invalid value: IP field is immutable"),
            "{changed}"
        );
        // A field of the wrong type, by the schema.
        let wrong = crds
            .refusal(
                "ips",
                &json!({"metadata": {"name": "db"}, "spec": {"ip": 4}}),
                None,
            )
            .unwrap();
        assert!(wrong.contains("/spec/ip"), "{wrong}");
        // A rule of Isthmus's own CRDs: an MTU no IPv4 path carries.
        let server = |mtu: u32| {
            json!({"apiVersion": "gateway.isthmus.dev/v1alpha1", "kind": "IsthmusGatewayServer",
                   "metadata": {"name": "rome", "namespace": "liqo-tenant-rome"},
                   "spec": {"mtu": mtu, "endpoint": {"port": 51840}}})
        };
        assert_eq!(
            crds.refusal("isthmusgatewayservers", &server(1340), None),
            None
        );
        let small = crds
            .refusal("isthmusgatewayservers", &server(500), None)
            .unwrap();
        assert!(
            small.contains("spec.mtu: Invalid value: an MTU below 576"),
            "{small}"
        );
        // A kind without a CRD here is not judged.
        assert_eq!(crds.refusal("pods", &json!({"spec": 1}), None), None);
    }
}
