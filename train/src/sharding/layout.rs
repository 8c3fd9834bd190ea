//! Where each float parameter of a burn module lies in one flat `f32`
//! buffer (the module's visit order), which rank owns it, and the visitors
//! and mappers that move gradients and values between the module and such
//! buffers.

use std::collections::HashSet;
use std::ops::Range;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::{Shape, TensorData};

/// One float parameter's place in the flat buffer.
struct Slot {
    id: ParamId,
    shape: Shape,
    elements: Range<usize>,
}

/// The float parameters of a module in visit order, cut into one
/// contiguous run of whole parameters per rank, balanced by size.
pub(crate) struct ParamLayout {
    slots: Vec<Slot>,
    /// Per rank, the indices of the parameters it owns.
    owned: Vec<Range<usize>>,
    /// Per rank, the elements of the flat buffer its parameters take.
    segments: Vec<Range<usize>>,
}

impl ParamLayout {
    /// The layout of `model`'s parameters over `world` ranks. A parameter
    /// belongs to the rank whose even share of the buffer holds its middle.
    pub(crate) fn new<M: Module>(model: &M, world: usize) -> Self {
        let mut collect = CollectSlots { slots: Vec::new() };
        model.visit(&mut collect);
        let slots = collect.slots;
        let total = slots.last().map_or(0, |slot| slot.elements.end);
        let owner = |slot: &Slot| match total {
            0 => 0,
            _ => ((slot.elements.start + slot.elements.len() / 2) * world / total).min(world - 1),
        };
        let owned: Vec<Range<usize>> = (0..world)
            .map(|rank| {
                let start = slots.iter().position(|slot| owner(slot) >= rank).unwrap_or(slots.len());
                let end = slots.iter().position(|slot| owner(slot) > rank).unwrap_or(slots.len());
                start..end
            })
            .collect();
        let offset = |index: usize| slots.get(index).map_or(total, |slot| slot.elements.start);
        let segments = owned
            .iter()
            .map(|params| offset(params.start)..offset(params.end))
            .collect();
        ParamLayout { slots, owned, segments }
    }

    /// Elements of every parameter together.
    pub(crate) fn total(&self) -> usize {
        self.slots.last().map_or(0, |slot| slot.elements.end)
    }

    /// Per rank, the part of the flat buffer it owns (for the collectives).
    pub(crate) fn segments(&self) -> &[Range<usize>] {
        &self.segments
    }

    /// The ids of the parameters `rank` owns.
    pub(crate) fn owned_ids(&self, rank: usize) -> HashSet<ParamId> {
        self.slots[self.owned[rank].clone()]
            .iter()
            .map(|slot| slot.id)
            .collect()
    }

    /// The elements `model`'s float parameters hold now (fewer than
    /// [`ParamLayout::total`] once some are emptied).
    pub(crate) fn held_elements<M: Module>(&self, model: &M) -> usize {
        let mut count = CountElements { elements: 0 };
        model.visit(&mut count);
        count.elements
    }

    /// Every parameter's gradient in `grads` (zeros where it has none), flat
    /// in `flat` (its old contents replaced; its allocation reused).
    pub(crate) fn flatten_grads<M: Module>(&self, model: &M, grads: &GradientsParams, flat: &mut Vec<f32>) {
        flat.clear();
        flat.reserve(self.total());
        let mut flatten = FlattenGrads {
            grads,
            flat,
            slots: self.slots.iter(),
        };
        model.visit(&mut flatten);
    }

    /// Gradients on `device` for the parameters of `owner` (every rank when
    /// `None`) that had one in `had`, read from `flat`, the whole buffer.
    pub(crate) fn grads_from_flat<M: Module>(
        &self,
        model: &M,
        had: &GradientsParams,
        flat: &[f32],
        owner: Option<usize>,
        device: &Device,
    ) -> GradientsParams {
        let mut unflatten = UnflattenGrads {
            had,
            flat,
            slots: self.slots.iter().enumerate(),
            keep: owner.map(|rank| self.owned[rank].clone()),
            device: device.clone(),
            out: GradientsParams::new(),
        };
        model.visit(&mut unflatten);
        unflatten.out
    }

    /// The values of `rank`'s parameters, written into its segment of `flat`.
    pub(crate) fn write_values<M: Module>(&self, model: &M, rank: usize, flat: &mut [f32]) {
        let mut write = WriteValues {
            slots: self.slots.iter().enumerate(),
            keep: self.owned[rank].clone(),
            flat,
        };
        model.visit(&mut write);
    }

    /// `model` with every parameter not owned by `rank` set from `flat`.
    pub(crate) fn fill_others<M: Module>(&self, model: M, rank: usize, flat: &[f32]) -> M {
        model.map(&mut FillValues {
            slots: self.slots.iter().enumerate(),
            skip: self.owned[rank].clone(),
            flat,
        })
    }

    /// `model` keeping only `rank`'s parameters: the others become empty
    /// tensors (same id, no elements) until [`ParamLayout::fill_others`].
    pub(crate) fn empty_others<M: Module>(&self, model: M, rank: usize) -> M {
        model.map(&mut EmptyValues {
            index: 0,
            keep: self.owned[rank].clone(),
        })
    }
}

/// Counts the elements of the float parameters a module holds.
struct CountElements {
    elements: usize,
}

impl ModuleVisitor for CountElements {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.elements += param.val().shape().num_elements();
    }
}

/// Records each float parameter's id, shape and place.
struct CollectSlots {
    slots: Vec<Slot>,
}

impl ModuleVisitor for CollectSlots {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let shape = param.val().shape();
        let start = self.slots.last().map_or(0, |slot| slot.elements.end);
        let elements = start..start + shape.num_elements();
        self.slots.push(Slot {
            id: param.id,
            shape,
            elements,
        });
    }
}

/// Appends each parameter's gradient, or zeros for one without.
struct FlattenGrads<'a, I> {
    grads: &'a GradientsParams,
    flat: &'a mut Vec<f32>,
    slots: I,
}

impl<'a, I: Iterator<Item = &'a Slot>> ModuleVisitor for FlattenGrads<'a, I> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let slot = self.slots.next().expect("the layout was made from this module");
        match self.grads.get::<D>(param.id) {
            Some(grad) => {
                let data = grad.into_data().convert::<f32>();
                self.flat
                    .extend_from_slice(data.as_slice::<f32>().expect("a float gradient converts to f32"));
            }
            None => self.flat.resize(slot.elements.end, 0.0),
        }
    }
}

/// Cuts gradients out of the flat buffer for the parameters kept.
struct UnflattenGrads<'a, I> {
    had: &'a GradientsParams,
    flat: &'a [f32],
    slots: I,
    keep: Option<Range<usize>>,
    device: Device,
    out: GradientsParams,
}

impl<'a, I: Iterator<Item = (usize, &'a Slot)>> ModuleVisitor for UnflattenGrads<'a, I> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let (index, slot) = self.slots.next().expect("the layout was made from this module");
        let kept = self.keep.as_ref().is_none_or(|keep| keep.contains(&index));
        if !kept || self.had.get::<D>(param.id).is_none() {
            return;
        }
        let values = self.flat[slot.elements.clone()].to_vec();
        let grad = Tensor::<D>::from_data(TensorData::new(values, slot.shape.clone()), &self.device);
        self.out.register(param.id, grad);
    }
}

/// Copies the values of the parameters kept into the flat buffer.
struct WriteValues<'f, I> {
    slots: I,
    keep: Range<usize>,
    flat: &'f mut [f32],
}

impl<'a, I: Iterator<Item = (usize, &'a Slot)>> ModuleVisitor for WriteValues<'_, I> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let (index, slot) = self.slots.next().expect("the layout was made from this module");
        if !self.keep.contains(&index) {
            return;
        }
        let values = param.val().into_data().try_into_vec_as::<f32>();
        self.flat[slot.elements.clone()].copy_from_slice(&values.expect("a float parameter converts to f32"));
    }
}

/// Sets the values of the parameters not skipped from the flat buffer, on
/// each one's device and with its gradient requirement.
struct FillValues<'f, I> {
    slots: I,
    skip: Range<usize>,
    flat: &'f [f32],
}

impl<'a, I: Iterator<Item = (usize, &'a Slot)>> ModuleMapper for FillValues<'_, I> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (index, slot) = self.slots.next().expect("the layout was made from this module");
        if self.skip.contains(&index) {
            return param;
        }
        let values = self.flat[slot.elements.clone()].to_vec();
        param.map(|tensor| {
            let require_grad = tensor.is_require_grad();
            let data = TensorData::new(values, slot.shape.clone());
            Tensor::<D>::from_data(data, &tensor.device()).set_require_grad(require_grad)
        })
    }
}

/// Empties the parameters outside `keep`.
struct EmptyValues {
    index: usize,
    keep: Range<usize>,
}

impl ModuleMapper for EmptyValues {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let index = self.index;
        self.index += 1;
        if self.keep.contains(&index) {
            return param;
        }
        param.map(|tensor| {
            let require_grad = tensor.is_require_grad();
            Tensor::<D>::empty([0; D], &tensor.device()).set_require_grad(require_grad)
        })
    }
}
