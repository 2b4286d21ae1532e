//! Issue 16, part 3: a recipe without `[cuda]` whose environment holds a CUDA runtime is
//! built as if it had the section that runtime implies, with a warning showing it.

use crate::{
    common::{LayoutView, Project},
    support::{channel::tiny_recipe, shared_channel},
};

#[test]
fn a_cuda_runtime_without_cuda_section_is_configured_for_the_toolkit_with_a_warning() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "gpu", &["cuda-cudart"]));
    let run = project.build(&[]).success();
    assert!(
        run.stderr.contains(
            "the environment holds CUDA runtime cuda-cudart 11.8.89 but the recipe has no [cuda]"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("[cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\""),
        "the lines that pin it: {}",
        run.stderr
    );

    let layout = LayoutView::new(project.path().join("images/gpu"));
    crate::common::assert_cuda_11_8_config(&layout);

    // Kubernetes follows the image: one GPU, on nodes whose driver runs it.
    let k8s = project
        .run(&[
            "k8s",
            "images/gpu",
            "--repository",
            "registry.example/ml/gpu",
        ])
        .success();
    assert!(k8s.stdout.contains("nvidia.com/gpu"), "{}", k8s.stdout);
    assert!(
        k8s.stdout.contains("nvidia.com/cuda.driver.major"),
        "{}",
        k8s.stdout
    );

    // Reused from its lock, the same image and the same warning.
    let again = project.build(&[]).success();
    assert!(
        again.stderr.contains("but the recipe has no [cuda]"),
        "{}",
        again.stderr
    );
}
