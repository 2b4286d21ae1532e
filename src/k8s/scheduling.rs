//! Where a pod may run: the node affinity (the kubelet's OS and architecture labels, GPU
//! feature discovery's driver and compute capability labels) and the taints it tolerates.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Toleration,
};

use super::{
    ARCH_LABEL, COMPUTE_MAJOR_LABEL, COMPUTE_MINOR_LABEL, DRIVER_MAJOR_LABEL, DRIVER_MINOR_LABEL,
    DRIVER_REV_LABEL, GPU_RESOURCE, K8sError, OS_LABEL, WorkloadOptions,
};
use crate::{cuda::compat::DriverVersion, inspect::ImageSummary};

/// The newest compute capability major the requirement spells out one by one; above it
/// only PTX runs, so a node either runs everything there (every package has PTX) or nothing.
const NEWEST_KNOWN_MAJOR: u32 = 12;

/// The nodes the pod may run on: Linux nodes of the image's architectures and, for a GPU pod
/// on a cluster with GPU feature discovery, a driver at least the image's minimum and a GPU
/// its kernels run on.
pub(super) fn affinity(
    image: &ImageSummary,
    options: &WorkloadOptions,
    gpus: u32,
) -> Result<Affinity, K8sError> {
    let min_driver = match image.cuda.as_ref().and_then(|c| c.min_driver.as_deref()) {
        Some(text) => Some(
            text.parse::<DriverVersion>()
                .map_err(|message| K8sError::Driver {
                    value: text.to_string(),
                    message,
                })?,
        ),
        None => None,
    };
    // Without GPU feature discovery no node carries its labels: only the kubelet's remain.
    let gfd = gpus > 0 && options.gpu_feature_discovery;
    let arches = architectures(image);
    let terms = match targeted_compute_terms(image, options, gpus)? {
        None => node_terms(&arches, min_driver.as_ref().filter(|_| gfd)),
        // Each GPU class with its own driver floor: the image's, raised where the kernels
        // run only by PTX whose ISA needs a newer driver (issue 30).
        Some(compute) => floor_groups(&compute, min_driver.as_ref())
            .into_iter()
            .flat_map(|(floor, group)| and_terms(node_terms(&arches, floor.as_ref()), &group))
            .collect(),
    };
    Ok(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Runs of `compute` terms of one driver floor (the larger of `min_driver` and a term's PTX
/// need), in order: terms of one floor share its driver terms.
fn floor_groups(
    compute: &[ComputeTerm],
    min_driver: Option<&DriverVersion>,
) -> Vec<(Option<DriverVersion>, Vec<Vec<NodeSelectorRequirement>>)> {
    let mut groups: Vec<(Option<DriverVersion>, Vec<Vec<NodeSelectorRequirement>>)> = Vec::new();
    for (term, ptx) in compute {
        let floor = min_driver.cloned().max(ptx.clone());
        match groups.last_mut() {
            Some((last, terms)) if *last == floor => terms.push(term.clone()),
            _ => groups.push((floor, vec![term.clone()])),
        }
    }
    groups
}

/// The OCI architectures of the image: each platform's of a multi-platform image (a node of
/// any of them pulls its own), else the one image's.
fn architectures(image: &ImageSummary) -> Vec<String> {
    if image.platforms.is_empty() {
        return vec![image.architecture.clone()];
    }
    let mut arches: Vec<String> = image
        .platforms
        .iter()
        .filter_map(|p| p.split('/').nth(1).map(str::to_string))
        .collect();
    arches.dedup();
    arches
}

/// The pod's required node terms: Linux nodes of one of `arches`, and, for a GPU pod of an
/// image with a minimum driver, a driver at least that ([`driver_terms`]; the platform
/// requirements are ANDed into each of its ORed terms).
pub(crate) fn node_terms(
    arches: &[String],
    driver: Option<&DriverVersion>,
) -> Vec<NodeSelectorTerm> {
    let platform = [
        NodeSelectorRequirement {
            key: OS_LABEL.to_string(),
            operator: "In".to_string(),
            values: Some(vec!["linux".to_string()]),
        },
        NodeSelectorRequirement {
            key: ARCH_LABEL.to_string(),
            operator: "In".to_string(),
            values: Some(arches.to_vec()),
        },
    ];
    let Some(driver) = driver else {
        return vec![NodeSelectorTerm {
            match_expressions: Some(platform.to_vec()),
            ..Default::default()
        }];
    };
    driver_terms(driver)
        .into_iter()
        .map(|mut term| {
            term.match_expressions
                .get_or_insert_with(Vec::new)
                .extend(platform.iter().cloned());
            term
        })
        .collect()
}

/// The compute capability requirement lists (ORed) the pod's node affinity ANDs into each
/// of its terms: for a GPU pod on a cluster with GPU feature discovery, without
/// `--any-gpu-architecture`, [`compute_terms`] of the architectures the image records (each
/// package's, else all together); none when it records none. The GPU class of the nodes, which
/// `--require-smoke-attestation`'s policy also holds the image's attestations to.
pub(super) fn targeted_compute_terms(
    image: &ImageSummary,
    options: &WorkloadOptions,
    gpus: u32,
) -> Result<Option<Vec<ComputeTerm>>, K8sError> {
    if gpus == 0 || !options.gpu_feature_discovery || options.any_gpu_architecture {
        return Ok(None);
    }
    image_compute_terms(image)
}

/// A compute capability requirement list and the driver its GPUs' PTX needs, if any.
pub(crate) type ComputeTerm = (Vec<NodeSelectorRequirement>, Option<DriverVersion>);

/// A package's architectures and the ISAs of its PTX.
pub(crate) type PackageKernels = (
    crate::cuda::fatbin::Architectures,
    crate::cuda::fatbin::PtxIsas,
);

/// [`compute_terms`] of the architectures `image` records; none when it records
/// none, an error when no GPU runs every package.
fn image_compute_terms(image: &ImageSummary) -> Result<Option<Vec<ComputeTerm>>, K8sError> {
    use crate::cuda::fatbin::{PtxIsas, format_list, parse_list};
    let Some(gpu) = &image.gpu else {
        return Ok(None);
    };
    let parse = |names: &[String]| parse_list(&names.join(",")).unwrap_or_default();
    let isas = |names: &[String]| -> PtxIsas {
        names
            .iter()
            .filter_map(|n| {
                let (arch, isa) = n.split_once(':')?;
                let arch: crate::cuda::fatbin::Arch = arch.parse().ok()?;
                Some((arch.sm, isa.parse().ok()?))
            })
            .collect()
    };
    let mut packages: Vec<PackageKernels> = gpu
        .packages
        .iter()
        .map(|p| (parse(&p.architectures), isas(&p.ptx_isa)))
        .filter(|(a, _)| !a.is_empty())
        .collect();
    if packages.is_empty() {
        packages.push((parse(&gpu.architectures), PtxIsas::new()));
    }
    if packages.iter().all(|(a, _)| a.is_empty()) {
        return Ok(None);
    }
    let compute = compute_terms(&packages);
    if compute.is_empty() {
        return Err(K8sError::NoGpuArchitecture {
            image: image.image.clone(),
            packages: packages
                .iter()
                .map(|(a, _)| format_list(a))
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    Ok(Some(compute))
}

/// The driver the PTX-only packages need on a GPU of compute capability `sm`: the newest
/// their ISAs need (for an ISA newer than imgbuild knows, the newest known ISA's, a floor).
fn ptx_need(packages: &[PackageKernels], sm: u32) -> Option<DriverVersion> {
    use crate::cuda::{
        compat::{PtxDriver, ptx_minimum_driver},
        fatbin::{Coverage, coverage},
    };
    packages
        .iter()
        .filter_map(|(archs, isas)| match coverage(archs, sm) {
            Coverage::PtxOnly(ptx) => isas.get(&ptx.sm).copied(),
            _ => None,
        })
        .filter_map(|isa| match ptx_minimum_driver(isa) {
            PtxDriver::Needs { driver, .. } => Some(driver),
            PtxDriver::NewerThanKnown { newest } => match ptx_minimum_driver(newest) {
                PtxDriver::Needs { driver, .. } => Some(driver),
                PtxDriver::NewerThanKnown { .. } => None,
            },
        })
        .max()
}

/// `terms` ANDed with `compute`: (a or b) and (c or d) is every pair, each requirement list
/// ANDed.
fn and_terms(
    terms: Vec<NodeSelectorTerm>,
    compute: &[Vec<NodeSelectorRequirement>],
) -> Vec<NodeSelectorTerm> {
    terms
        .iter()
        .flat_map(|term| {
            compute.iter().map(move |extra| {
                let mut term = term.clone();
                term.match_expressions
                    .get_or_insert_with(Vec::new)
                    .extend(extra.iter().cloned());
                term
            })
        })
        .collect()
}

/// The requirement lists (ORed) matching GPUs, by GPU feature discovery's compute capability
/// labels, on which every one of `packages` runs its kernels (SASS of the major at or below
/// the minor, or PTX at or below the capability). Empty when no GPU does.
///
/// Within a major, what runs is every minor from some minor up (SASS and PTX alike), so each
/// major needs one `minor > m - 1`; majors that run from minor 0 share one `In` (one per
/// driver need), and past [`NEWEST_KNOWN_MAJOR`] only PTX runs, the same for every major
/// there. Each list comes with the driver its GPUs' PTX needs ([`ptx_need`], the newest over
/// its capabilities), `None` where every package runs SASS.
pub(crate) fn compute_terms(packages: &[PackageKernels]) -> Vec<ComputeTerm> {
    use crate::cuda::fatbin::{Coverage, coverage};
    let runs = |sm: u32| {
        packages
            .iter()
            .all(|(archs, _)| coverage(archs, sm) != Coverage::None)
    };
    let need_from = |major: u32, minor: u32| {
        (minor..=9)
            .filter_map(|m| ptx_need(packages, major * 10 + m))
            .max()
    };
    let newest = packages
        .iter()
        .flat_map(|(archs, _)| archs)
        .map(|a| a.sm / 10)
        .max()
        .unwrap_or(0)
        .max(NEWEST_KNOWN_MAJOR);
    let requirement = |label: &str, operator: &str, values: Vec<String>| NodeSelectorRequirement {
        key: label.to_string(),
        operator: operator.to_string(),
        values: Some(values),
    };
    // Whole majors by the driver their PTX needs, no need first.
    let mut whole_majors: Vec<(Option<DriverVersion>, Vec<String>)> = Vec::new();
    let mut terms = Vec::new();
    for major in 1..=newest {
        match (0..=9).find(|minor| runs(major * 10 + minor)) {
            Some(0) => {
                let need = need_from(major, 0);
                match whole_majors.iter_mut().find(|(n, _)| *n == need) {
                    Some((_, majors)) => majors.push(major.to_string()),
                    None => whole_majors.push((need, vec![major.to_string()])),
                }
            }
            Some(minor) => terms.push((
                vec![
                    requirement(COMPUTE_MAJOR_LABEL, "In", vec![major.to_string()]),
                    requirement(COMPUTE_MINOR_LABEL, "Gt", vec![(minor - 1).to_string()]),
                ],
                need_from(major, minor),
            )),
            None => {}
        }
    }
    whole_majors.sort_by(|a, b| a.0.cmp(&b.0));
    let whole = whole_majors
        .into_iter()
        .map(|(need, majors)| (vec![requirement(COMPUTE_MAJOR_LABEL, "In", majors)], need));
    let mut terms: Vec<ComputeTerm> = whole.chain(terms).collect();
    let beyond = (newest + 1) * 10;
    if runs(beyond) {
        terms.push((
            vec![requirement(
                COMPUTE_MAJOR_LABEL,
                "Gt",
                vec![newest.to_string()],
            )],
            ptx_need(packages, beyond),
        ));
    }
    terms
}

/// Node selector terms (ORed; requirements within a term ANDed) matching nodes whose driver
/// is at least `driver`: `Gt` compares integers, so `≥ 520.61.05` becomes major > 520, or
/// major 520 and minor > 61, or 520.61 and rev > 4.
pub(crate) fn driver_terms(driver: &DriverVersion) -> Vec<NodeSelectorTerm> {
    let text = driver.to_string();
    let parts: Vec<u32> = text.split('.').filter_map(|p| p.parse().ok()).collect();
    let labels = [DRIVER_MAJOR_LABEL, DRIVER_MINOR_LABEL, DRIVER_REV_LABEL];
    let requirement = |label: &str, operator: &str, value: String| NodeSelectorRequirement {
        key: label.to_string(),
        operator: operator.to_string(),
        values: Some(vec![value]),
    };
    let mut terms = Vec::new();
    for depth in 0..parts.len() {
        let mut expressions: Vec<NodeSelectorRequirement> = (0..depth)
            .map(|i| requirement(labels[i], "In", label_value(i, parts[i])))
            .collect();
        // The last part may equal the minimum: "> n - 1".
        let last = depth == parts.len() - 1;
        let bound = if last {
            i64::from(parts[depth]) - 1
        } else {
            i64::from(parts[depth])
        };
        expressions.push(requirement(labels[depth], "Gt", bound.to_string()));
        terms.push(NodeSelectorTerm {
            match_expressions: Some(expressions),
            ..Default::default()
        });
    }
    terms
}

/// GPU feature discovery writes minor versions as the driver does (`104`), and the
/// revision zero-padded to two digits (`05`).
fn label_value(index: usize, value: u32) -> String {
    if index == 2 {
        format!("{value:02}")
    } else {
        value.to_string()
    }
}

/// The GPU node pools' taint `nvidia.com/gpu` (any value, NoSchedule: what GKE, EKS's
/// guides and the GPU operator's examples put on GPU nodes) when `gpu`, and `extra`;
/// sorted and without repeats, since their order means nothing.
pub(super) fn tolerations(extra: &[Toleration], gpu: bool) -> Option<Vec<Toleration>> {
    let mut all = extra.to_vec();
    if gpu {
        all.push(Toleration {
            key: Some(GPU_RESOURCE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        });
    }
    let order = |t: &Toleration| {
        (
            t.key.clone(),
            t.operator.clone(),
            t.value.clone(),
            t.effect.clone(),
        )
    };
    all.sort_by_key(order);
    all.dedup_by(|a, b| order(a) == order(b));
    (!all.is_empty()).then_some(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(driver: &str) -> Vec<Vec<(String, String, String)>> {
        driver_terms(&driver.parse().unwrap())
            .into_iter()
            .map(|t| {
                t.match_expressions
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.key, r.operator, r.values.unwrap()[0].clone()))
                    .collect()
            })
            .collect()
    }

    /// [`compute_terms`] of packages given as `sm_80,compute_80`, as `label op values`.
    fn compute(packages: &[&str]) -> Vec<String> {
        let packages: Vec<_> = packages
            .iter()
            .map(|p| {
                (
                    crate::cuda::fatbin::parse_list(p).unwrap(),
                    Default::default(),
                )
            })
            .collect();
        compute_terms(&packages)
            .into_iter()
            .map(|(term, _)| {
                term.iter()
                    .map(|r| {
                        let key = r.key.trim_start_matches("nvidia.com/gpu.compute.");
                        format!(
                            "{key} {} {}",
                            r.operator,
                            r.values.as_ref().unwrap().join(",")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" & ")
            })
            .collect()
    }

    #[test]
    fn compute_capability_terms_are_the_gpus_every_package_runs_on() {
        // CUDA 12.1's cuRAND: SASS from 5.0 to 9.0, PTX compute_90 for anything newer.
        assert_eq!(
            compute(&["sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90,compute_90"]),
            ["major In 5,6,7,8,9,10,11,12", "major Gt 12"]
        );
        // SASS alone: its major only, from its minor (8.6 and 8.9, not 8.0 or 9.0).
        assert_eq!(compute(&["sm_86"]), ["major In 8 & minor Gt 5"]);
        // Every package must run: 8.x by SASS of one and PTX of the other, 9.0 and newer by
        // PTX of both; 6.x and 7.x run only the second.
        assert_eq!(
            compute(&["sm_80,sm_86,compute_86", "sm_60,compute_60"]),
            ["major In 8,9,10,11,12", "major Gt 12"]
        );
        // A minor threshold beside whole majors.
        assert_eq!(
            compute(&["sm_75,sm_80"]),
            ["major In 8", "major In 7 & minor Gt 4"]
        );
        // Hopper-only and Ampere-only packages: no GPU runs both.
        assert!(compute(&["sm_90", "sm_80"]).is_empty());
    }

    #[test]
    fn a_gpu_class_that_runs_only_ptx_gets_the_driver_its_isa_needs() {
        use crate::cuda::fatbin::parse_list;
        // CUDA 12.1's cuRAND: PTX compute_90 of ISA 8.1 for anything past 9.0.
        let curand = (
            parse_list("sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90,compute_90").unwrap(),
            crate::cuda::fatbin::PtxIsas::from([(90, "8.1".parse().unwrap())]),
        );
        let terms: Vec<(String, Option<String>)> = compute_terms(&[curand])
            .into_iter()
            .map(|(term, need)| {
                let values = term[0].values.as_ref().unwrap().join(",");
                (
                    format!("{} {values}", term[0].operator),
                    need.map(|d| d.to_string()),
                )
            })
            .collect();
        assert_eq!(
            terms,
            [
                ("In 5,6,7,8,9".to_string(), None),
                ("In 10,11,12".to_string(), Some("530.30.02".to_string())),
                ("Gt 12".to_string(), Some("530.30.02".to_string())),
            ]
        );
        // The floor is the larger of the image's and the PTX need, one run per floor.
        let compute = compute_terms(&[(
            parse_list("sm_80,compute_80").unwrap(),
            crate::cuda::fatbin::PtxIsas::from([(80, "8.1".parse().unwrap())]),
        )]);
        let groups = floor_groups(&compute, Some(&"525.60.13".parse().unwrap()));
        let floors: Vec<String> = groups
            .iter()
            .map(|(f, t)| format!("{} x{}", f.as_ref().unwrap(), t.len()))
            .collect();
        assert_eq!(floors, ["525.60.13 x1", "530.30.02 x2"]);
        let above = floor_groups(&compute, Some(&"535.54.03".parse().unwrap()));
        assert_eq!(above.len(), 1, "{above:?}");
    }

    #[test]
    fn every_term_asks_for_linux_nodes_of_the_image_architectures() {
        let arches = vec!["amd64".to_string(), "arm64".to_string()];
        let platform = vec![
            (
                OS_LABEL.to_string(),
                "In".to_string(),
                vec!["linux".to_string()],
            ),
            (ARCH_LABEL.to_string(), "In".to_string(), arches.clone()),
        ];
        let of = |terms: Vec<NodeSelectorTerm>| -> Vec<Vec<(String, String, Vec<String>)>> {
            terms
                .into_iter()
                .map(|t| {
                    t.match_expressions
                        .unwrap()
                        .into_iter()
                        .map(|r| (r.key, r.operator, r.values.unwrap()))
                        .collect()
                })
                .collect()
        };
        assert_eq!(of(node_terms(&arches, None)), vec![platform.clone()]);
        let with_driver = of(node_terms(&arches, Some(&"520.61.05".parse().unwrap())));
        assert_eq!(with_driver.len(), 3);
        for term in &with_driver {
            assert_eq!(term[term.len() - 2..], platform[..], "{term:?}");
        }
        assert_eq!(with_driver[0][0].0, DRIVER_MAJOR_LABEL);
    }

    #[test]
    fn driver_minimum_becomes_ored_terms() {
        let t = terms("520.61.05");
        assert_eq!(t.len(), 3);
        assert_eq!(
            t[0],
            vec![(DRIVER_MAJOR_LABEL.into(), "Gt".into(), "520".into())]
        );
        assert_eq!(
            t[1],
            vec![
                (DRIVER_MAJOR_LABEL.into(), "In".into(), "520".into()),
                (DRIVER_MINOR_LABEL.into(), "Gt".into(), "61".into()),
            ]
        );
        assert_eq!(
            t[2],
            vec![
                (DRIVER_MAJOR_LABEL.into(), "In".into(), "520".into()),
                (DRIVER_MINOR_LABEL.into(), "In".into(), "61".into()),
                (DRIVER_REV_LABEL.into(), "Gt".into(), "4".into()),
            ]
        );
        // A bare major: major > 579 (that is, ≥ 580).
        assert_eq!(
            terms("580"),
            vec![vec![(DRIVER_MAJOR_LABEL.into(), "Gt".into(), "579".into())]]
        );
    }
}
