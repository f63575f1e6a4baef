/* Fused forward-only rollout of TensegrityEngine's semi-implicit step (physics/integrators.py),
 * or of its implicitfast step (`implicitfast`: the velocity update implicit per rod in the
 * rod's own cable damping and gyroscopic torque, a 6x6 solve per rod), or of its rk4 step
 * (`rk4`: four stages of the semi-implicit step's accelerations, integrators.RungeKutta4).
 *
 * One call runs `steps` steps of `_step_soa(..., integrator=...)` for a batch
 * of samples: actuator filter, cables, ground contacts (normal, rolling and torsional
 * friction), capsule-capsule contacts, Newton-Euler accelerations, the velocity-implicit
 * ground sliding friction pass, and the exponential-map orientation update.  Every
 * expression keeps the operand order of the torch code (same divisions, no reciprocal
 * tricks), and the three small matmuls use fused multiply-adds in MKL's order, so results
 * agree with torch to rounding (not bit for bit: torch's sqrt and cos are not always
 * correctly rounded, and the actuator's exponential here is a series).  Build without
 * implicit contraction (-ffp-contract=off) to keep it so (the float32 build, for planning,
 * contracts: it is compared at float32's precision). The soft ground's Newton solve is
 * the exception: an iterative minimisation, it agrees with torch's to its tolerance, and
 * fuses its multiply-adds freely.
 *
 * Layout: samples are processed in chunks of LANES.  Every per-chunk quantity is an array
 * [n][LANES] with the sample innermost, and every arithmetic loop runs over the lanes of
 * one chunk under `omp simd`, which the compiler turns into straight vector code (the soft
 * ground's solver works in vector types instead, see there).  A chunk
 * is independent of the others for the whole rollout, so it runs all its steps while its
 * working set stays in L1, and threads take whole chunks. The library links this source
 * twice: the wide unit (LANES) and a narrow one (-DTG_NARROW, LANES / 2) that runs a
 * batch's tail when wide chunks would leave threads idle (tg_schedule).
 *
 * Build with -DTG_FLOAT for float32 (default float64); the entry point is tg_rollout.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE4_1__) || defined(__AVX__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef LANES
#define LANES 8
#endif

#ifdef TG_FLOAT
typedef float real;
#define SQRT sqrtf
#define FABS fabsf
#define EXP expf
#define FMA fmaf
#define COS cosf
#define SIN sinf
#else
typedef double real;
#define SQRT sqrt
#define FABS fabs
#define EXP exp
#define FMA fma
#define COS cos
#define SIN sin
#endif
typedef int64_t idx_t;

#define TG_PI 3.14159265358979323846
#define LANE_LOOP _Pragma("omp simd") for (int l = 0; l < LANES; ++l)
#define ROW(base, i) ((base) + (size_t)(i) * LANES)

/* Topology, parameters broadcast per element, and constants derived in Python with the
 * same torch expressions as the engine (so they round identically). */
typedef struct {
    int32_t rods, cables, actuated, pairs;
    int32_t floor, has_fixed;
    /* cable c joins rods lo < hi; W[c, rod] and W[c, R + rod] of the engine's W matrix */
    const int32_t *cable_lo, *cable_hi;
    const real *cable_wpos_lo, *cable_wpos_hi, *cable_wax_lo, *cable_wax_hi;
    const int32_t *cable_act;      /* actuated index giving the rest length, -1: passive */
    const real *passive_rest;      /* [C], used where cable_act < 0 */
    const real *stiffness, *damping, *slack_damping;  /* [C]: damping only taut, damping taut or slack */
    const real *gain, *offset, *decay, *tau, *max_speed;  /* [A]; decay = exp(-h / tau) */
    const real *command_low, *command_high;                            /* [A] */
    int32_t actuate_mean;          /* actuator_timing "mean" (1) or "start" (0) */
    const real *mass, *mass_gravity;   /* [R], [3][R] */
    const real *ia_minus_it, *inv_it, *inv_ia_minus_inv_it, *free, *half;  /* [R] */
    const real *node_radius, *node_inv_mass;                           /* [2R] */
    const int32_t *pair_a, *pair_b;
    const real *pair_radius_a, *pair_radius_b;                         /* [P] */
    real h, half_h, ground_height;
    real contact_stiffness, contact_damping, mu, mu_torsional, mu_rolling;
    real angular_eps2, friction_eps2;
    const real *inertia_t, *inertia_a;   /* [R]: transverse and axial inertia (implicitfast, soft ground) */
    int32_t implicitfast;          /* step implicit per rod in its cable damping and gyroscopic torque */
    int32_t rk4;                   /* four Runge-Kutta stages (RungeKutta4) */
    real quarter_h, magnus;        /* rk4: half a half step (its stage rotations), h / 12 */
    /* soft ground (contact.law soft, soft_contact.SoftGroundContact): condim, the reference
     * spring-damper B and K (time constant clamped to two steps), the regulariser's factor
     * on (1 - imp) / (imp m), and solimp */
    int32_t soft_ground, soft_condim;
    real soft_b, soft_k, soft_reg, soft_dmin, soft_dmax, soft_width, soft_mid, soft_power;
    /* soft rod pairs (soft_pairs.SoftPairRows): the same constants, the pairs' contacts solved
     * with the ground's (the floor's soft_ground may be off: no floor) */
    int32_t soft_pairs;
} tg_model;

/* Strided views of the caller's tensors, in elements (a stride may be 0: broadcast). */
typedef struct {
    idx_t batch, steps, hold, record_every;
    const real *state0;  idx_t s0_b, s0_r, s0_k;
    const real *act0;    idx_t a0_b, a0_a;
    const real *commands; idx_t c_b, c_s, c_a;      /* command row k applies to steps [k hold, (k+1) hold) */
    const real *wrenches; idx_t w_b, w_s, w_r, w_k; /* NULL: none */
    real *states;        idx_t o_b, o_s, o_r, o_k;
    real *acts;          idx_t oa_b, oa_s, oa_a;
} tg_io;

/* Per-chunk working arrays, [n][LANES] each. */
typedef struct {
    real *st;                    /* [13][R]: p, q, v, w */
    real *act, *cmd, *act_end, *act_used, *rest;
    real *axis, *axis_rate;      /* [3][R] */
    real *gen_pos, *gen_axis;    /* [3][R]: W^T (tension u), on centres and axes */
    real *force, *torque, *acc, *alpha;
    real *node, *node_rate;      /* [3][2R] */
    real *normal, *slip_x, *slip_y, *lever;   /* [2R], [2R], [2R], [3][2R] */
    real *point_a, *point_b, *pnormal, *depth;  /* [3][P], [3][P], [3][P], [P] */
    real *pair_force, *pair_torque_a, *pair_torque_b;  /* [3][R] */
    real *wrench;                /* [6][R] */
    real *damp;                  /* [21][R]: implicitfast, each rod's own cable damping block (upper) */
    real *cable_dir;             /* [4][C]: implicitfast, each cable's unit vector and clamped force */
    real *soft_prev;             /* [7][R]: soft ground, each rod's last solution and whether it has one */
    real *soft_set;              /* [20][R]: soft ground, each rod's last active rows (1 / 0) */
    real *st0;                   /* [13][R]: rk4, the state at the start of the step */
    real *rk_pose, *rk_sum;      /* [6][R]: rk4, the stages' weighted velocities and accelerations */
    real *rk_vel;                /* [6][R]: rk4, the next stage's (or the step's) velocities */
    int *pair_touch;             /* [P]: some lane of the pair in contact */
    struct soft_slot_s *pair_slots; /* soft pairs: the rows of the coupled solve, one slot across the lanes */
    real *pair_own;              /* [R]: soft pairs, whether the rod is in the lane's coupled solve (1 / 0) */
    real *pair_a0, *pair_a;      /* [6][R]: soft pairs, the solve's start (0: not the lane's rod) and result */
    real *pair_saved;            /* [6][R]: soft pairs, force and torque before the ground */
    real *pair_coupled;          /* [1]: soft pairs, whether the lane has a coupled solve */
    real *pair_last_own, *pair_last_a;  /* [R], [6][R]: soft pairs, the last solve's rods and result */
    real *pair_set;              /* [10 P + 20 R]: soft pairs, each row's activity at the last solve (1 / 0) */
    void *pair_vec;              /* soft pairs: the solver's vectors (vreal, aligned) */
    idx_t sample[LANES];         /* batch index of each lane (padding lanes repeat the last) */
    void *block;                 /* the allocation holding all of the above */
} tg_work;

static int soft_pairs_alloc(tg_work *w, const tg_model *m);

static int work_alloc(tg_work *w, const tg_model *m)
{
    const size_t R = m->rods, C = m->cables, A = m->actuated, P = m->pairs;
    const size_t rows[] = {13 * R, A, A, A, A, C, 3 * R, 3 * R, 3 * R, 3 * R, 3 * R, 3 * R, 3 * R,
                           3 * R, 6 * R, 6 * R, 2 * R, 2 * R, 2 * R, 6 * R, 3 * P, 3 * P, 3 * P, P,
                           3 * R, 3 * R, 3 * R, 6 * R, 21 * R, 4 * C, 7 * R, 20 * R, 13 * R, 6 * R, 6 * R, 6 * R};
    real **ptr[] = {&w->st, &w->act, &w->cmd, &w->act_end, &w->act_used, &w->rest, &w->axis,
                    &w->axis_rate, &w->gen_pos, &w->gen_axis, &w->force, &w->torque, &w->acc,
                    &w->alpha, &w->node, &w->node_rate, &w->normal, &w->slip_x, &w->slip_y,
                    &w->lever, &w->point_a, &w->point_b, &w->pnormal, &w->depth, &w->pair_force,
                    &w->pair_torque_a, &w->pair_torque_b, &w->wrench, &w->damp, &w->cable_dir,
                    &w->soft_prev, &w->soft_set, &w->st0, &w->rk_pose, &w->rk_sum, &w->rk_vel};
    const size_t n = sizeof(rows) / sizeof(rows[0]);
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) total += rows[i] + 1;   /* + 1: no zero-size arrays */
    const size_t row_bytes = LANES * sizeof(real), align = 64;
    w->block = malloc(total * row_bytes + align + (P + 1) * sizeof(int));
    if (!w->block) return -1;
    real *at = (real *)(((uintptr_t)w->block + align - 1) & ~(uintptr_t)(align - 1));  /* cache lines */
    w->pair_touch = (int *)(at + total * LANES);
    for (size_t i = 0; i < n; ++i) {
        *ptr[i] = at;
        at += (rows[i] + 1) * LANES;
    }
    w->pair_slots = NULL; w->pair_own = NULL; w->pair_vec = NULL;
    return m->soft_pairs ? soft_pairs_alloc(w, m) : 0;
}

/* ------------------------------------------------------------------ forces */

/* Rod axes (body z) and their rates w x axis. */
static void kinematics(const tg_model *m, tg_work *w)
{
    const int R = m->rods;
    for (int r = 0; r < R; ++r) {
        const real *qw = ROW(w->st, 3 * R + r), *qx = ROW(w->st, 4 * R + r);
        const real *qy = ROW(w->st, 5 * R + r), *qz = ROW(w->st, 6 * R + r);
        const real *wx = ROW(w->st, 10 * R + r), *wy = ROW(w->st, 11 * R + r), *wz = ROW(w->st, 12 * R + r);
        real *ax = ROW(w->axis, r), *ay = ROW(w->axis, R + r), *az = ROW(w->axis, 2 * R + r);
        real *rx = ROW(w->axis_rate, r), *ry = ROW(w->axis_rate, R + r), *rz = ROW(w->axis_rate, 2 * R + r);
        LANE_LOOP {
            const real a0 = (real)2 * (qx[l] * qz[l] + qw[l] * qy[l]);
            const real a1 = (real)2 * (qy[l] * qz[l] - qw[l] * qx[l]);
            const real a2 = qw[l] * qw[l] - qx[l] * qx[l] - qy[l] * qy[l] + qz[l] * qz[l];
            ax[l] = a0; ay[l] = a1; az[l] = a2;
            rx[l] = wy[l] * a2 - wz[l] * a1;
            ry[l] = wz[l] * a0 - wx[l] * a2;
            rz[l] = wx[l] * a1 - wy[l] * a0;
        }
    }
}

/* Tension-only spring-dampers plus tendon damping (acting slack too); accumulates
 * W^T (tension u) in the engine's column order. */
/* implicitfast: c j j^T into rod `rod`'s upper-triangular damping block, j = (u, r x u) for a
 * cable end at lever r (G^T u u^T G with G = [I, -[r]x], as jacobians.own_cable_damping_blocks). */
static inline void add_damping(real *damp, int R, int rod, int l, real c, real u0, real u1, real u2,
                               real r0, real r1, real r2)
{
    const real j[6] = {u0, u1, u2, r1 * u2 - r2 * u1, r2 * u0 - r0 * u2, r0 * u1 - r1 * u0};
    int t = 0;
    for (int i = 0; i < 6; ++i)
        for (int k = i; k < 6; ++k, ++t) ROW(damp, t * R + rod)[l] += c * j[i] * j[k];
}

static void cables(const tg_model *m, tg_work *w)
{
    const int R = m->rods, C = m->cables;
    memset(w->gen_pos, 0, sizeof(real) * 3 * R * LANES);
    memset(w->gen_axis, 0, sizeof(real) * 3 * R * LANES);
    const int implicitfast = m->implicitfast;
    if (implicitfast) memset(w->damp, 0, sizeof(real) * 21 * R * LANES);
    for (int c = 0; c < C; ++c) {
        const int lo = m->cable_lo[c], hi = m->cable_hi[c];
        const real wp_lo = m->cable_wpos_lo[c], wp_hi = m->cable_wpos_hi[c];
        const real wa_lo = m->cable_wax_lo[c], wa_hi = m->cable_wax_hi[c];
        const real K = m->stiffness[c], D = m->damping[c], Ds = m->slack_damping[c];
        const real *rest = ROW(w->rest, c);
        const real *p0 = ROW(w->st, lo), *p1 = ROW(w->st, R + lo), *p2 = ROW(w->st, 2 * R + lo);
        const real *q0 = ROW(w->st, hi), *q1 = ROW(w->st, R + hi), *q2 = ROW(w->st, 2 * R + hi);
        const real *v0 = ROW(w->st, 7 * R + lo), *v1 = ROW(w->st, 8 * R + lo), *v2 = ROW(w->st, 9 * R + lo);
        const real *u0 = ROW(w->st, 7 * R + hi), *u1 = ROW(w->st, 8 * R + hi), *u2 = ROW(w->st, 9 * R + hi);
        const real *a0 = ROW(w->axis, lo), *a1 = ROW(w->axis, R + lo), *a2 = ROW(w->axis, 2 * R + lo);
        const real *b0 = ROW(w->axis, hi), *b1 = ROW(w->axis, R + hi), *b2 = ROW(w->axis, 2 * R + hi);
        const real *ra0 = ROW(w->axis_rate, lo), *ra1 = ROW(w->axis_rate, R + lo), *ra2 = ROW(w->axis_rate, 2 * R + lo);
        const real *rb0 = ROW(w->axis_rate, hi), *rb1 = ROW(w->axis_rate, R + hi), *rb2 = ROW(w->axis_rate, 2 * R + hi);
        real *gp_lo0 = ROW(w->gen_pos, lo), *gp_lo1 = ROW(w->gen_pos, R + lo), *gp_lo2 = ROW(w->gen_pos, 2 * R + lo);
        real *gp_hi0 = ROW(w->gen_pos, hi), *gp_hi1 = ROW(w->gen_pos, R + hi), *gp_hi2 = ROW(w->gen_pos, 2 * R + hi);
        real *ga_lo0 = ROW(w->gen_axis, lo), *ga_lo1 = ROW(w->gen_axis, R + lo), *ga_lo2 = ROW(w->gen_axis, 2 * R + lo);
        real *ga_hi0 = ROW(w->gen_axis, hi), *ga_hi1 = ROW(w->gen_axis, R + hi), *ga_hi2 = ROW(w->gen_axis, 2 * R + hi);
        LANE_LOOP {
            /* d = Y W^T as torch's matmul (MKL) computes it: fused multiply-adds over Y's
             * columns in order, centres (lo, hi) then axes (lo, hi) */
            const real d0 = FMA(wa_hi, b0[l], FMA(wa_lo, a0[l], wp_lo * p0[l] + wp_hi * q0[l]));
            const real d1 = FMA(wa_hi, b1[l], FMA(wa_lo, a1[l], wp_lo * p1[l] + wp_hi * q1[l]));
            const real d2 = FMA(wa_hi, b2[l], FMA(wa_lo, a2[l], wp_lo * p2[l] + wp_hi * q2[l]));
            const real e0 = FMA(wa_hi, rb0[l], FMA(wa_lo, ra0[l], wp_lo * v0[l] + wp_hi * u0[l]));
            const real e1 = FMA(wa_hi, rb1[l], FMA(wa_lo, ra1[l], wp_lo * v1[l] + wp_hi * u1[l]));
            const real e2 = FMA(wa_hi, rb2[l], FMA(wa_lo, ra2[l], wp_lo * v2[l] + wp_hi * u2[l]));
            const real length = SQRT(d0 * d0 + d1 * d1 + d2 * d2);
            const real n0 = d0 / length, n1 = d1 / length, n2 = d2 / length;
            const real rate = e0 * n0 + e1 * n1 + e2 * n2;
            const real stretch = K * (length - rest[l]) + D * rate;
            const real tension = (stretch < 0 ? (real)0 : stretch) + Ds * rate;
            /* kept for implicitfast's damping blocks; stored unconditionally: a branch here
               stops the lane loop vectorising (planning 3.5x slower, measured) */
            ROW(w->cable_dir, c)[l] = n0; ROW(w->cable_dir, C + c)[l] = n1;
            ROW(w->cable_dir, 2 * C + c)[l] = n2; ROW(w->cable_dir, 3 * C + c)[l] = stretch;
            const real t0 = tension * n0, t1 = tension * n1, t2 = tension * n2;
            gp_lo0[l] += t0 * wp_lo; gp_lo1[l] += t1 * wp_lo; gp_lo2[l] += t2 * wp_lo;
            gp_hi0[l] += t0 * wp_hi; gp_hi1[l] += t1 * wp_hi; gp_hi2[l] += t2 * wp_hi;
            ga_lo0[l] = FMA(t0, wa_lo, ga_lo0[l]); ga_lo1[l] = FMA(t1, wa_lo, ga_lo1[l]);
            ga_lo2[l] = FMA(t2, wa_lo, ga_lo2[l]);
            ga_hi0[l] = FMA(t0, wa_hi, ga_hi0[l]); ga_hi1[l] = FMA(t1, wa_hi, ga_hi1[l]);
            ga_hi2[l] = FMA(t2, wa_hi, ga_hi2[l]);
        }
        if (m->implicitfast) {
            /* the end on rod lo sits at lever (wa_lo / wp_lo) a_lo, likewise on rod hi; the
             * clamped part damps only while it pulls (MuJoCo skips a clamped actuator) */
            const real s_lo = wa_lo / wp_lo, s_hi = wa_hi / wp_hi;
            for (int l = 0; l < LANES; ++l) {
                const real n0 = ROW(w->cable_dir, c)[l], n1 = ROW(w->cable_dir, C + c)[l];
                const real n2 = ROW(w->cable_dir, 2 * C + c)[l];
                const real damping = (ROW(w->cable_dir, 3 * C + c)[l] > 0 ? D : (real)0) + Ds;
                add_damping(w->damp, R, lo, l, damping, n0, n1, n2, s_lo * a0[l], s_lo * a1[l], s_lo * a2[l]);
                add_damping(w->damp, R, hi, l, damping, n0, n1, n2, s_hi * b0[l], s_hi * b1[l], s_hi * b2[l]);
            }
        }
    }
    /* force = -(W^T tu) on the centres, torque = axis x -(W^T tu) on the axes */
    for (int r = 0; r < R; ++r) {
        const real *g0 = ROW(w->gen_pos, r), *g1 = ROW(w->gen_pos, R + r), *g2 = ROW(w->gen_pos, 2 * R + r);
        const real *h0 = ROW(w->gen_axis, r), *h1 = ROW(w->gen_axis, R + r), *h2 = ROW(w->gen_axis, 2 * R + r);
        const real *ax = ROW(w->axis, r), *ay = ROW(w->axis, R + r), *az = ROW(w->axis, 2 * R + r);
        real *f0 = ROW(w->force, r), *f1 = ROW(w->force, R + r), *f2 = ROW(w->force, 2 * R + r);
        real *t0 = ROW(w->torque, r), *t1 = ROW(w->torque, R + r), *t2 = ROW(w->torque, 2 * R + r);
        LANE_LOOP {
            f0[l] = -g0[l]; f1[l] = -g1[l]; f2[l] = -g2[l];
            const real b0 = -h0[l], b1 = -h1[l], b2 = -h2[l];
            t0[l] = ay[l] * b2 - az[l] * b1;
            t1[l] = az[l] * b0 - ax[l] * b2;
            t2[l] = ax[l] * b1 - ay[l] * b0;
        }
    }
}

/* End nodes and their velocities: node 2r+e = p + (-+ L/2) axis. */
static void nodes(const tg_model *m, tg_work *w)
{
    const int R = m->rods, N = 2 * m->rods;
    for (int n = 0; n < N; ++n) {
        const int r = n / 2;
        const real lever = (n & 1) ? m->half[r] : -m->half[r];
        for (int i = 0; i < 3; ++i) {
            const real *p = ROW(w->st, i * R + r), *v = ROW(w->st, (7 + i) * R + r);
            const real *a = ROW(w->axis, i * R + r), *ar = ROW(w->axis_rate, i * R + r);
            real *x = ROW(w->node, i * N + n), *xd = ROW(w->node_rate, i * N + n);
            LANE_LOOP {
                x[l] = FMA(lever, a[l], p[l]);      /* as the matmul Y N^T */
                xd[l] = FMA(lever, ar[l], v[l]);
            }
        }
    }
}

/* Penalty normal force and rolling / torsional friction of the end spheres on the floor
 * (sliding friction comes later, velocity-implicitly: see ground_friction). */
static void ground(const tg_model *m, tg_work *w)
{
    const int R = m->rods, N = 2 * m->rods;
    const real kc = m->contact_stiffness, cc = m->contact_damping;
    const real mu_r = m->mu_rolling, neg_mu_t = -m->mu_torsional;
    for (int n = 0; n < N; ++n) {
        const int r = n / 2;
        const real rad = m->node_radius[n], gh = m->ground_height;
        const real *x0 = ROW(w->node, n), *x1 = ROW(w->node, N + n), *x2 = ROW(w->node, 2 * N + n);
        const real *xd0 = ROW(w->node_rate, n), *xd1 = ROW(w->node_rate, N + n), *xd2 = ROW(w->node_rate, 2 * N + n);
        const real *p0 = ROW(w->st, r), *p1 = ROW(w->st, R + r), *p2 = ROW(w->st, 2 * R + r);
        const real *wx = ROW(w->st, 10 * R + r), *wy = ROW(w->st, 11 * R + r);
        real *normal = ROW(w->normal, n), *sx = ROW(w->slip_x, n), *sy = ROW(w->slip_y, n);
        real *l0 = ROW(w->lever, n), *l1 = ROW(w->lever, N + n), *l2 = ROW(w->lever, 2 * N + n);
        LANE_LOOP {
            const real depth = rad - (x2[l] - gh);
            /* lever from the centre to the contact point node - r e_z */
            l0[l] = x0[l] - p0[l];
            l1[l] = x1[l] - p1[l];
            l2[l] = (x2[l] - p2[l]) - rad;
            sx[l] = xd0[l] - rad * wy[l];
            sy[l] = xd1[l] + rad * wx[l];
            const real push = kc * depth - cc * xd2[l];
            normal[l] = depth > 0 ? (push < 0 ? (real)0 : push) : (real)0;
        }
    }
    for (int r = 0; r < R; ++r) {
        const real *n0 = ROW(w->normal, 2 * r), *n1 = ROW(w->normal, 2 * r + 1);
        const real *ly0 = ROW(w->lever, N + 2 * r), *ly1 = ROW(w->lever, N + 2 * r + 1);
        const real *lx0 = ROW(w->lever, 2 * r), *lx1 = ROW(w->lever, 2 * r + 1);
        const real *wx = ROW(w->st, 10 * R + r), *wy = ROW(w->st, 11 * R + r), *wz = ROW(w->st, 12 * R + r);
        real *f2 = ROW(w->force, 2 * R + r);
        real *t0 = ROW(w->torque, r), *t1 = ROW(w->torque, R + r), *t2 = ROW(w->torque, 2 * R + r);
        const real eps2 = m->angular_eps2;
        LANE_LOOP {
            const real load = n0[l] + n1[l];
            const real spin = SQRT(wz[l] * wz[l] + eps2);
            const real roll = SQRT(wx[l] * wx[l] + wy[l] * wy[l] + eps2);
            const real roll_coef = mu_r * load / roll;
            f2[l] = f2[l] + load;
            t0[l] = t0[l] + ((ly0[l] * n0[l] + ly1[l] * n1[l]) - roll_coef * wx[l]);
            t1[l] = t1[l] + (-(lx0[l] * n0[l] + lx1[l] * n1[l]) - roll_coef * wy[l]);
            t2[l] = t2[l] + neg_mu_t * load * wz[l] / spin;
        }
    }
}

static inline real clamp01(real x) { return x < 0 ? (real)0 : (x > 1 ? (real)1 : x); }

/* Gap between the intervals [a0, a1] and [b0, b1] (negative if they overlap). */
static inline real box_gap(real a0, real a1, real b0, real b1)
{
    const real lo_a = a0 < a1 ? a0 : a1, hi_a = a0 < a1 ? a1 : a0;
    const real lo_b = b0 < b1 ? b0 : b1, hi_b = b0 < b1 ? b1 : b0;
    return lo_b - hi_a > lo_a - hi_b ? lo_b - hi_a : lo_a - hi_b;
}

/* Whether two capsule axes are further apart than `limit` in every lane, by two cheap
 * lower bounds of the segment distance: the gap between their axis-aligned boxes, and
 * the distance between their lines |r.n| / |n|, n = d1 x d2 (used unless the axes are
 * within ~0.6 deg of parallel, where rounding would make it unreliable).  `limit` is the
 * radii plus a margin far above rounding, so a far pair's computed depth is negative:
 * its response is exactly zero and its geometry can be skipped. */
static int pair_far(const tg_work *w, int N, int na, int nb, real limit)
{
    const real *ax0 = ROW(w->node, na), *ay0 = ROW(w->node, N + na), *az0 = ROW(w->node, 2 * N + na);
    const real *ax1 = ROW(w->node, na + 1), *ay1 = ROW(w->node, N + na + 1), *az1 = ROW(w->node, 2 * N + na + 1);
    const real *bx0 = ROW(w->node, nb), *by0 = ROW(w->node, N + nb), *bz0 = ROW(w->node, 2 * N + nb);
    const real *bx1 = ROW(w->node, nb + 1), *by1 = ROW(w->node, N + nb + 1), *bz1 = ROW(w->node, 2 * N + nb + 1);
    int near = 0;
    _Pragma("omp simd reduction(|:near)")
    for (int l = 0; l < LANES; ++l) {
        const real gx = box_gap(ax0[l], ax1[l], bx0[l], bx1[l]);
        const real gy = box_gap(ay0[l], ay1[l], by0[l], by1[l]);
        const real gz = box_gap(az0[l], az1[l], bz0[l], bz1[l]);
        const real d10 = ax1[l] - ax0[l], d11 = ay1[l] - ay0[l], d12 = az1[l] - az0[l];
        const real d20 = bx1[l] - bx0[l], d21 = by1[l] - by0[l], d22 = bz1[l] - bz0[l];
        const real n0 = d11 * d22 - d12 * d21, n1 = d12 * d20 - d10 * d22, n2 = d10 * d21 - d11 * d20;
        const real nn = n0 * n0 + n1 * n1 + n2 * n2;
        const real rn = (ax0[l] - bx0[l]) * n0 + (ay0[l] - by0[l]) * n1 + (az0[l] - bz0[l]) * n2;
        const real parallel_limit = (real)1e-4 * (d10 * d10 + d11 * d11 + d12 * d12) * (d20 * d20 + d21 * d21 + d22 * d22);
        const int lines_far = (nn > parallel_limit) & (rn * rn > limit * limit * nn);
        const int boxes_far = (gx > limit) | (gy > limit) | (gz > limit);
        near |= !(lines_far | boxes_far);     /* NaN counts as near: the full geometry handles it */
    }
    return !near;
}

/* Closest points of the rod axes of every pair (collision.capsule_contacts); marks the
 * pairs with a lane deeper than -margin (in contact for margin 0: the others' penalty
 * response is exactly zero) and returns whether there is any. */
static int pair_geometry(const tg_model *m, tg_work *w, real margin)
{
    const int N = 2 * m->rods, P = m->pairs;
    int touching = 0;
    for (int p = 0; p < P; ++p) {
        const int na = 2 * m->pair_a[p], nb = 2 * m->pair_b[p];
        const real rad_a = m->pair_radius_a[p], rad_b = m->pair_radius_b[p];
        const real rad_sum = rad_a + rad_b;
        const real *A0[3], *A1[3], *B0[3], *B1[3];
        real *pa[3], *pb[3], *nv[3];
        for (int i = 0; i < 3; ++i) {
            A0[i] = ROW(w->node, i * N + na); A1[i] = ROW(w->node, i * N + na + 1);
            B0[i] = ROW(w->node, i * N + nb); B1[i] = ROW(w->node, i * N + nb + 1);
            pa[i] = ROW(w->point_a, i * P + p); pb[i] = ROW(w->point_b, i * P + p);
            nv[i] = ROW(w->pnormal, i * P + p);
        }
        w->pair_touch[p] = 0;
        if (pair_far(w, N, na, nb, rad_sum * (real)1.01)) continue;
        real *depth = ROW(w->depth, p);
        int any = 0;
        _Pragma("omp simd reduction(|:any)")
        for (int l = 0; l < LANES; ++l) {
            const real d10 = A1[0][l] - A0[0][l], d11 = A1[1][l] - A0[1][l], d12 = A1[2][l] - A0[2][l];
            const real d20 = B1[0][l] - B0[0][l], d21 = B1[1][l] - B0[1][l], d22 = B1[2][l] - B0[2][l];
            const real r0 = A0[0][l] - B0[0][l], r1 = A0[1][l] - B0[1][l], r2 = A0[2][l] - B0[2][l];
            const real a = d10 * d10 + d11 * d11 + d12 * d12;
            const real e = d20 * d20 + d21 * d21 + d22 * d22;
            const real f = d20 * r0 + d21 * r1 + d22 * r2;
            const real c = d10 * r0 + d11 * r1 + d12 * r2;
            const real b = d10 * d20 + d11 * d21 + d12 * d22;
            const real denom = a * e - b * b;
            const int parallel = denom <= (real)1e-9 * a * e;
            real s = parallel ? (real)0 : (b * f - c * e) / (parallel ? (real)1 : denom);
            s = clamp01(s);
            const real t = (b * s + f) / e;
            const real t_clamped = clamp01(t);
            if (t != t_clamped) s = clamp01((b * t_clamped - c) / a);
            const real pa0 = A0[0][l] + s * d10, pa1 = A0[1][l] + s * d11, pa2 = A0[2][l] + s * d12;
            const real pb0 = B0[0][l] + t_clamped * d20, pb1 = B0[1][l] + t_clamped * d21,
                       pb2 = B0[2][l] + t_clamped * d22;
            const real g0 = pa0 - pb0, g1 = pa1 - pb1, g2 = pa2 - pb2;
            const real dist = SQRT(g0 * g0 + g1 * g1 + g2 * g2 + (real)1e-12);
            const real u0 = g0 / dist, u1 = g1 / dist, u2 = g2 / dist;
            nv[0][l] = u0; nv[1][l] = u1; nv[2][l] = u2;
            pa[0][l] = pa0 - rad_a * u0; pa[1][l] = pa1 - rad_a * u1; pa[2][l] = pa2 - rad_a * u2;
            pb[0][l] = pb0 + rad_b * u0; pb[1][l] = pb1 + rad_b * u1; pb[2][l] = pb2 + rad_b * u2;
            depth[l] = rad_sum - dist;
            any |= depth[l] > -margin;
        }
        w->pair_touch[p] = any;
        touching |= any;
    }
    return touching;
}

/* Penalty normal force and smooth Coulomb friction between touching capsules. */
static void pair_response(const tg_model *m, tg_work *w)
{
    const int R = m->rods, P = m->pairs;
    const real kc = m->contact_stiffness, cc = m->contact_damping, mu = m->mu, eps2 = m->friction_eps2;
    memset(w->pair_force, 0, sizeof(real) * 3 * R * LANES);
    memset(w->pair_torque_a, 0, sizeof(real) * 3 * R * LANES);
    memset(w->pair_torque_b, 0, sizeof(real) * 3 * R * LANES);
    for (int p = 0; p < P; ++p) {
        if (!w->pair_touch[p]) continue;
        const int ia = m->pair_a[p], ib = m->pair_b[p];
        const real *pa[3], *pb[3], *nv[3], *ca[3], *cb[3], *va[3], *vb[3], *wa[3], *wb[3];
        real *fa[3], *fb[3], *ta[3], *tb[3];
        for (int i = 0; i < 3; ++i) {
            pa[i] = ROW(w->point_a, i * P + p); pb[i] = ROW(w->point_b, i * P + p);
            nv[i] = ROW(w->pnormal, i * P + p);
            ca[i] = ROW(w->st, i * R + ia); cb[i] = ROW(w->st, i * R + ib);
            va[i] = ROW(w->st, (7 + i) * R + ia); vb[i] = ROW(w->st, (7 + i) * R + ib);
            wa[i] = ROW(w->st, (10 + i) * R + ia); wb[i] = ROW(w->st, (10 + i) * R + ib);
            fa[i] = ROW(w->pair_force, i * R + ia); fb[i] = ROW(w->pair_force, i * R + ib);
            ta[i] = ROW(w->pair_torque_a, i * R + ia); tb[i] = ROW(w->pair_torque_b, i * R + ib);
        }
        const real *depth = ROW(w->depth, p);
        LANE_LOOP {
            const real ra0 = pa[0][l] - ca[0][l], ra1 = pa[1][l] - ca[1][l], ra2 = pa[2][l] - ca[2][l];
            const real rb0 = pb[0][l] - cb[0][l], rb1 = pb[1][l] - cb[1][l], rb2 = pb[2][l] - cb[2][l];
            const real v0 = ((va[0][l] + (wa[1][l] * ra2 - wa[2][l] * ra1)) - vb[0][l]) - (wb[1][l] * rb2 - wb[2][l] * rb1);
            const real v1 = ((va[1][l] + (wa[2][l] * ra0 - wa[0][l] * ra2)) - vb[1][l]) - (wb[2][l] * rb0 - wb[0][l] * rb2);
            const real v2 = ((va[2][l] + (wa[0][l] * ra1 - wa[1][l] * ra0)) - vb[2][l]) - (wb[0][l] * rb1 - wb[1][l] * rb0);
            const real n0 = nv[0][l], n1 = nv[1][l], n2 = nv[2][l];
            const real vn = v0 * n0 + v1 * n1 + v2 * n2;
            const real push = kc * depth[l] - cc * vn;
            const real normal = depth[l] > 0 ? (push < 0 ? (real)0 : push) : (real)0;
            const real vt0 = v0 - vn * n0, vt1 = v1 - vn * n1, vt2 = v2 - vn * n2;
            const real speed = SQRT(vt0 * vt0 + vt1 * vt1 + vt2 * vt2 + eps2);
            const real coef = mu * normal / speed;
            const real f0 = normal * n0 - coef * vt0, f1 = normal * n1 - coef * vt1, f2 = normal * n2 - coef * vt2;
            fa[0][l] += f0; fa[1][l] += f1; fa[2][l] += f2;
            fb[0][l] -= f0; fb[1][l] -= f1; fb[2][l] -= f2;
            ta[0][l] += ra1 * f2 - ra2 * f1; ta[1][l] += ra2 * f0 - ra0 * f2; ta[2][l] += ra0 * f1 - ra1 * f0;
            tb[0][l] += rb1 * f2 - rb2 * f1; tb[1][l] += rb2 * f0 - rb0 * f2; tb[2][l] += rb0 * f1 - rb1 * f0;
        }
    }
    for (int i = 0; i < 3 * R; ++i) {
        real *f = ROW(w->force, i), *t = ROW(w->torque, i);
        const real *pf = ROW(w->pair_force, i), *pta = ROW(w->pair_torque_a, i), *ptb = ROW(w->pair_torque_b, i);
        LANE_LOOP {
            f[l] = f[l] + pf[l];
            t[l] = (t[l] + pta[l]) - ptb[l];
        }
    }
}

/* Gravity and the optional external wrench at the rod centres. */
static void external(const tg_model *m, tg_work *w, int with_wrench)
{
    const int R = m->rods;
    for (int i = 0; i < 3 * R; ++i) {
        real *f = ROW(w->force, i);
        const real g = m->mass_gravity[i];
        LANE_LOOP f[l] = f[l] + g;
    }
    if (!with_wrench) return;
    for (int i = 0; i < 3 * R; ++i) {
        real *f = ROW(w->force, i), *t = ROW(w->torque, i);
        const real *wf = ROW(w->wrench, i), *wt = ROW(w->wrench, 3 * R + i);
        LANE_LOOP {
            f[l] = f[l] + wf[l];
            t[l] = t[l] + wt[l];
        }
    }
}

/* Newton-Euler for axisymmetric rods (RigidRods.accelerations). */
static void accelerations(const tg_model *m, tg_work *w)
{
    const int R = m->rods;
    for (int r = 0; r < R; ++r) {
        const real m_r = m->mass[r], d_i = m->ia_minus_it[r], inv_t = m->inv_it[r];
        const real d_inv = m->inv_ia_minus_inv_it[r], fr = m->free[r];
        const real *ax = ROW(w->axis, r), *ay = ROW(w->axis, R + r), *az = ROW(w->axis, 2 * R + r);
        const real *rx = ROW(w->axis_rate, r), *ry = ROW(w->axis_rate, R + r), *rz = ROW(w->axis_rate, 2 * R + r);
        const real *wx = ROW(w->st, 10 * R + r), *wy = ROW(w->st, 11 * R + r), *wz = ROW(w->st, 12 * R + r);
        const real *f0 = ROW(w->force, r), *f1 = ROW(w->force, R + r), *f2 = ROW(w->force, 2 * R + r);
        const real *t0 = ROW(w->torque, r), *t1 = ROW(w->torque, R + r), *t2 = ROW(w->torque, 2 * R + r);
        real *a0 = ROW(w->acc, r), *a1 = ROW(w->acc, R + r), *a2 = ROW(w->acc, 2 * R + r);
        real *b0 = ROW(w->alpha, r), *b1 = ROW(w->alpha, R + r), *b2 = ROW(w->alpha, 2 * R + r);
        const int fixed = m->has_fixed;
        LANE_LOOP {
            const real gyro = d_i * (ax[l] * wx[l] + ay[l] * wy[l] + az[l] * wz[l]);
            const real tau0 = t0[l] - gyro * rx[l], tau1 = t1[l] - gyro * ry[l], tau2 = t2[l] - gyro * rz[l];
            const real along = d_inv * (ax[l] * tau0 + ay[l] * tau1 + az[l] * tau2);
            real c0 = f0[l] / m_r, c1 = f1[l] / m_r, c2 = f2[l] / m_r;
            real e0 = tau0 * inv_t + along * ax[l], e1 = tau1 * inv_t + along * ay[l];
            real e2 = tau2 * inv_t + along * az[l];
            if (fixed) {
                c0 = c0 * fr; c1 = c1 * fr; c2 = c2 * fr;
                e0 = e0 * fr; e1 = e1 * fr; e2 = e2 * fr;
            }
            a0[l] = c0; a1[l] = c1; a2[l] = c2;
            b0[l] = e0; b1[l] = e1; b2[l] = e2;
        }
    }
}

/* Solve the 6x6 system a x = b in place (Gaussian elimination, partial pivoting). */
static void solve6(real a[6][6], real b[6])
{
    for (int c = 0; c < 6; ++c) {
        int p = c;
        for (int r = c + 1; r < 6; ++r)
            if ((a[r][c] < 0 ? -a[r][c] : a[r][c]) > (a[p][c] < 0 ? -a[p][c] : a[p][c])) p = r;
        if (p != c) {
            for (int k = 0; k < 6; ++k) { const real t = a[c][k]; a[c][k] = a[p][k]; a[p][k] = t; }
            const real t = b[c]; b[c] = b[p]; b[p] = t;
        }
        for (int r = c + 1; r < 6; ++r) {
            const real f = a[r][c] / a[c][c];
            for (int k = c; k < 6; ++k) a[r][k] -= f * a[c][k];
            b[r] -= f * b[c];
        }
    }
    for (int c = 5; c >= 0; --c) {
        real v = b[c];
        for (int k = c + 1; k < 6; ++k) v -= a[c][k] * b[k];
        b[c] = v / a[c][c];
    }
}

/* implicitfast (integrators.ImplicitFast): per rod (M + h D_rr + h d(w x I w)/dw) (a, alpha)
 * = (f, tau - w x I w). */
static void accelerations_implicit(const tg_model *m, tg_work *w)
{
    const int R = m->rods;
    const real h = m->h;
    for (int r = 0; r < R; ++r) {
        const real m_r = m->mass[r], it = m->inertia_t[r], ia = m->inertia_a[r], d_i = m->ia_minus_it[r];
        const real fr = m->free[r];
        for (int l = 0; l < LANES; ++l) {
            const real ax[3] = {ROW(w->axis, r)[l], ROW(w->axis, R + r)[l], ROW(w->axis, 2 * R + r)[l]};
            const real om[3] = {ROW(w->st, 10 * R + r)[l], ROW(w->st, 11 * R + r)[l], ROW(w->st, 12 * R + r)[l]};
            const real rate[3] = {ROW(w->axis_rate, r)[l], ROW(w->axis_rate, R + r)[l],
                                  ROW(w->axis_rate, 2 * R + r)[l]};
            real a[6][6], b[6], iw[3][3], s[3];
            int t = 0;
            for (int i = 0; i < 6; ++i)
                for (int k = i; k < 6; ++k, ++t) a[i][k] = a[k][i] = h * ROW(w->damp, t * R + r)[l];
            for (int i = 0; i < 3; ++i) {
                a[i][i] += m_r;
                for (int k = 0; k < 3; ++k) iw[i][k] = (i == k ? it : (real)0) + (ia - it) * ax[i] * ax[k];
            }
            for (int i = 0; i < 3; ++i) s[i] = iw[i][0] * om[0] + iw[i][1] * om[1] + iw[i][2] * om[2];
            for (int k = 0; k < 3; ++k) {         /* + I_w + h ([w]x I_w - [I_w w]x), column k */
                const real c0 = iw[0][k], c1 = iw[1][k], c2 = iw[2][k];
                const real wxc[3] = {om[1] * c2 - om[2] * c1, om[2] * c0 - om[0] * c2, om[0] * c1 - om[1] * c0};
                const real sx[3] = {k == 0 ? 0 : (k == 1 ? -s[2] : s[1]), k == 0 ? s[2] : (k == 1 ? 0 : -s[0]),
                                    k == 0 ? -s[1] : (k == 1 ? s[0] : 0)};
                for (int i = 0; i < 3; ++i) a[3 + i][3 + k] += iw[i][k] + h * (wxc[i] - sx[i]);
            }
            const real gyro = d_i * (ax[0] * om[0] + ax[1] * om[1] + ax[2] * om[2]);
            for (int i = 0; i < 3; ++i) {
                b[i] = ROW(w->force, i * R + r)[l];
                b[3 + i] = ROW(w->torque, i * R + r)[l] - gyro * rate[i];
            }
            solve6(a, b);
            for (int i = 0; i < 3; ++i) {
                ROW(w->acc, i * R + r)[l] = m->has_fixed ? b[i] * fr : b[i];
                ROW(w->alpha, i * R + r)[l] = m->has_fixed ? b[3 + i] * fr : b[3 + i];
            }
        }
    }
}

/* x^pw, for the impedance's low = mid^(power-1) and high = (1 - mid)^(power-1), taken once
 * per step (pow is most of the cost otherwise). */
static real soft_power(real x, real pw)
{
    return pw == (real)2 ? x * x : pw == (real)1 ? x : (real)pow(x, pw);
}

/* MuJoCo's impedance of a violation (soft_contact.impedance) for every lane of `dist`
 * (violations; a lane out of the floor gets a value it never uses); low = mid^(power-1),
 * high = (1 - mid)^(power-1). Power 2 (MuJoCo's default) stays in vector code; another
 * power calls pow per lane. */
static void soft_impedance(const tg_model *m, const real dist[LANES], real imp[LANES], real low, real high)
{
    const real dmin = m->soft_dmin, dmax = m->soft_dmax, width = m->soft_width;
    const real mid = m->soft_mid, pw = m->soft_power;
    if (dmin == dmax || width <= (real)1e-15) {
        LANE_LOOP imp[l] = (real)0.5 * (dmin + dmax);
        return;
    }
    real x[LANES];
    LANE_LOOP {
        const real v = FABS(dist[l]) / width;
        x[l] = v > 1 ? (real)1 : v;
    }
    if (pw == (real)2) {
        LANE_LOOP {
            const real y = x[l] <= mid ? x[l] * x[l] / low : (real)1 - ((real)1 - x[l]) * ((real)1 - x[l]) / high;
            imp[l] = dmin + (dmax - dmin) * y;
        }
    } else {
        for (int l = 0; l < LANES; ++l) {
            const real y = x[l] <= mid ? (real)pow(x[l], pw) / low : (real)1 - (real)pow(1 - x[l], pw) / high;
            imp[l] = dmin + (dmax - dmin) * y;
        }
    }
}

#define SOFT_ROWS 20
#define SOFT_NEWTON 10
#define SOFT_LINE_SEARCH 4
#ifdef TG_FLOAT
#define SOFT_ROUNDING ((real)1e-5)      /* a Newton step this small (relative) is rounding */
#define SOFT_ALPHA ((real)1e-5)         /* a full line-search step up to rounding */
#else
#define SOFT_ROUNDING ((real)1e-13)
#define SOFT_ALPHA ((real)1e-10)
#endif

/* The solver works in the compiler's vector types (GCC / Clang vector extensions), one
 * native vector of VL lanes at a time (VL <= LANES; lanes are independent, so a chunk is
 * solved part by part, each part stopping on its own). Its flags and accumulators then stay
 * in registers across the loops over rows, where [LANES] arrays went through memory at
 * every row (a store-to-load chain per row; measured on an AMD Zen 4, MPPI at the paper's
 * sizes as AVX2 code: 0.095 -> 0.076 s per plan on one thread, this change alone). Vectors wider than the
 * target's registers were no faster, and 2x slower in float64 on AVX2 (GCC moves them
 * through memory). Flags are reals 0 / 1; masks are compare results (all bits set: true). */
#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
#ifdef TG_FLOAT
#define REAL_BYTES 4
#else
#define REAL_BYTES 8
#endif
#define VEC_BYTES (LANES * REAL_BYTES < VBYTES ? LANES * REAL_BYTES : VBYTES)   /* a vector's size */
#define VL (VEC_BYTES / REAL_BYTES)
typedef real vreal __attribute__((vector_size(VL * sizeof(real))));
#ifdef TG_FLOAT
typedef int32_t vmask __attribute__((vector_size(VL * sizeof(real))));
#else
typedef int64_t vmask __attribute__((vector_size(VL * sizeof(real))));
#endif
_Static_assert(LANES % VL == 0, "a chunk is whole vectors");
static inline vreal vload(const real *p) { vreal v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(real *p, vreal v) { memcpy(p, &v, sizeof v); }
static inline vreal vsel(vmask m, vreal a, vreal b) { return (vreal)(((vmask)a & m) | ((vmask)b & ~m)); }
static inline vreal vflag(vmask m) { const vreal zero = {0}; return vsel(m, zero + 1, zero); }
static inline vreal vabs(vreal a) { const vreal zero = {0}; return (vreal)((vmask)a & ~(vmask)(-zero)); }
/* whether any lane of m is set: one test instruction where the target has it (a loop over
 * the lanes moves each through a scalar register) */
static inline int vany(vmask m)
{
#if VEC_BYTES == 64 && defined(__AVX512F__)
    return _mm512_test_epi64_mask((__m512i)m, (__m512i)m) != 0;
#elif VEC_BYTES == 32 && defined(__AVX__)
    return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#elif VEC_BYTES == 16 && defined(__SSE4_1__)
    return !_mm_testz_si128((__m128i)m, (__m128i)m);
#else
    int any = 0;
    for (int l = 0; l < (int)VL; ++l) any |= m[l] != 0;
    return any;
#endif
}
/* a * b + c, fused where the target has FMA: GCC compiles the solver's functions with
 * contraction (the pragma below; Clang ignores it and leaves them unfused: slower, as
 * correct). The solver needs no bitwise agreement with torch, only the minimum, and its
 * chains are latency-bound. */
#define VFMA(a, b, c) ((a) * (b) + (c))
/* init + sum_i A[i] B[i] over i < 6 */
#define SOFT_DOT6(A, B, init) VFMA((A)[5], (B)[5], VFMA((A)[4], (B)[4], VFMA((A)[3], (B)[3], \
    VFMA((A)[2], (B)[2], VFMA((A)[1], (B)[1], VFMA((A)[0], (B)[0], (init)))))))

/* The inverse of a symmetric 3x3 (upper triangle a00 a01 a02 a11 a12 a22) by cofactors,
 * into i00 .. i22. */
#define SOFT_SYM3_INVERSE(a00, a01, a02, a11, a12, a22, i00, i01, i02, i11, i12, i22) { \
    const vreal c00 = VFMA(a11, a22, -a12 * a12), c01 = VFMA(a02, a12, -a01 * a22), c02 = VFMA(a01, a12, -a02 * a11); \
    const vreal c11 = VFMA(a00, a22, -a02 * a02), c12 = VFMA(a01, a02, -a00 * a12), c22 = VFMA(a00, a11, -a01 * a01); \
    const vreal inv_det = 1 / VFMA(a02, c02, VFMA(a01, c01, a00 * c00)); \
    i00 = c00 * inv_det; i01 = c01 * inv_det; i02 = c02 * inv_det; \
    i11 = c11 * inv_det; i12 = c12 * inv_det; i22 = c22 * inv_det; }
#define SOFT_DOT3(a0, a1, a2, b0, b1, b2) VFMA(a2, b2, VFMA(a1, b1, (a0) * (b0)))

#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

/* x = -H^-1 g per lane, H symmetric positive definite (a rod's mass matrix plus active
 * rows; its lower triangle is read), by 3x3 blocks [A B; B' C]: A^-1 and the Schur
 * complement's inverse (C - B'A^-1 B)^-1 by cofactors. A >= m I and the complement of an SPD
 * matrix is SPD, so neither inverse needs pivoting. Measured against a 6x6 Cholesky on
 * such matrices in float32: 222 against 575 cycles per 8 lanes (the Cholesky's 6 square
 * roots and divisions are one serial chain; here two independent divisions), with a
 * residual |Hx + g| / (|H||x|) of 4e-7 against 2e-7. */
static inline void soft_newton_step(vreal H[6][6], const vreal g[6], vreal x[6])
{
    vreal i00, i01, i02, i11, i12, i22;
    SOFT_SYM3_INVERSE(H[0][0], H[1][0], H[2][0], H[1][1], H[2][1], H[2][2], i00, i01, i02, i11, i12, i22)
    const vreal b00 = H[3][0], b01 = H[4][0], b02 = H[5][0];    /* B[i][j] = H[3 + j][i] */
    const vreal b10 = H[3][1], b11 = H[4][1], b12 = H[5][1];
    const vreal b20 = H[3][2], b21 = H[4][2], b22 = H[5][2];
    const vreal y00 = SOFT_DOT3(i00, i01, i02, b00, b10, b20), y01 = SOFT_DOT3(i00, i01, i02, b01, b11, b21);
    const vreal y02 = SOFT_DOT3(i00, i01, i02, b02, b12, b22), y10 = SOFT_DOT3(i01, i11, i12, b00, b10, b20);
    const vreal y11 = SOFT_DOT3(i01, i11, i12, b01, b11, b21), y12 = SOFT_DOT3(i01, i11, i12, b02, b12, b22);
    const vreal y20 = SOFT_DOT3(i02, i12, i22, b00, b10, b20), y21 = SOFT_DOT3(i02, i12, i22, b01, b11, b21);
    const vreal y22 = SOFT_DOT3(i02, i12, i22, b02, b12, b22);                /* Y = A^-1 B */
    const vreal s00 = H[3][3] - SOFT_DOT3(b00, b10, b20, y00, y10, y20);      /* S = C - B'Y */
    const vreal s01 = H[4][3] - SOFT_DOT3(b00, b10, b20, y01, y11, y21);
    const vreal s02 = H[5][3] - SOFT_DOT3(b00, b10, b20, y02, y12, y22);
    const vreal s11 = H[4][4] - SOFT_DOT3(b01, b11, b21, y01, y11, y21);
    const vreal s12 = H[5][4] - SOFT_DOT3(b01, b11, b21, y02, y12, y22);
    const vreal s22 = H[5][5] - SOFT_DOT3(b02, b12, b22, y02, y12, y22);
    vreal t00, t01, t02, t11, t12, t22;
    SOFT_SYM3_INVERSE(s00, s01, s02, s11, s12, s22, t00, t01, t02, t11, t12, t22)
    const vreal g0 = -g[0], g1 = -g[1], g2 = -g[2];
    const vreal u0 = SOFT_DOT3(i00, i01, i02, g0, g1, g2), u1 = SOFT_DOT3(i01, i11, i12, g0, g1, g2);
    const vreal u2 = SOFT_DOT3(i02, i12, i22, g0, g1, g2);                     /* u = A^-1 (-g1) */
    const vreal r0 = -g[3] - SOFT_DOT3(b00, b10, b20, u0, u1, u2);             /* -g2 - B'u */
    const vreal r1 = -g[4] - SOFT_DOT3(b01, b11, b21, u0, u1, u2);
    const vreal r2 = -g[5] - SOFT_DOT3(b02, b12, b22, u0, u1, u2);
    const vreal x3 = SOFT_DOT3(t00, t01, t02, r0, r1, r2), x4 = SOFT_DOT3(t01, t11, t12, r0, r1, r2);
    const vreal x5 = SOFT_DOT3(t02, t12, t22, r0, r1, r2);
    x[0] = u0 - SOFT_DOT3(y00, y01, y02, x3, x4, x5);
    x[1] = u1 - SOFT_DOT3(y10, y11, y12, x3, x4, x5);
    x[2] = u2 - SOFT_DOT3(y20, y21, y22, x3, x4, x5);
    x[3] = x3; x[4] = x4; x[5] = x5;
}
#pragma GCC pop_options

/* One rod's soft ground problem, all lanes: the pyramid rows of both end spheres (D = 0 on
 * a sphere out of the floor), its rotational mass matrix, a0 and the starting point. */
typedef struct {
    real J[SOFT_ROWS][6][LANES], aref[SOFT_ROWS][LANES], D[SOFT_ROWS][LANES];
    real Mr[3][3][LANES], a0[6][LANES], a[6][LANES];
    real done[LANES];                 /* 1: this lane is solved (or has no contact) */
    real from_last[LANES];            /* 1: start from the last step's active rows, set */
    real set[SOFT_ROWS][LANES];       /* in: the last step's active rows; out: this one's */
    int rows, live[SOFT_ROWS];        /* live: the row's sphere is in the floor in some lane */
} soft_rod;

/* J rows, aref and D of rod r's end spheres (SoftGroundContact.rows): per sphere the
 * normal row plus or minus mu times each cone direction (sliding along the rod's projected
 * axis t and across it b, torsional, rolling about t and b, as condim has them). */
static void soft_rows(const tg_model *m, const tg_work *w, int r, soft_rod *restrict s, real low, real high)
{
    const int R = m->rods, N = 2 * R, condim = m->soft_condim;
    const int nd = condim == 6 ? 5 : condim == 4 ? 3 : condim == 3 ? 2 : 0;   /* cone directions */
    const int edges = nd ? 2 * nd : 1;
    const real mus[5] = {m->mu, m->mu, m->mu_torsional, m->mu_rolling, m->mu_rolling};
    const real gh = m->ground_height, mass = m->mass[r], soft_b = m->soft_b, soft_k = m->soft_k;
    const real reg = m->soft_reg;
    const real *px = ROW(w->st, r), *py = ROW(w->st, R + r), *pz = ROW(w->st, 2 * R + r);
    const real *v0 = ROW(w->st, 7 * R + r), *v1 = ROW(w->st, 8 * R + r), *v2 = ROW(w->st, 9 * R + r);
    const real *v3 = ROW(w->st, 10 * R + r), *v4 = ROW(w->st, 11 * R + r), *v5 = ROW(w->st, 12 * R + r);
    const real *ax = ROW(w->axis, r), *ay = ROW(w->axis, R + r), *az = ROW(w->axis, 2 * R + r);
    s->rows = 2 * edges;
    LANE_LOOP s->done[l] = 1;
    for (int e = 0; e < 2; ++e) {
        const int n = 2 * r + e, base = e * edges;
        const real rad = m->node_radius[n];
        const real *xr = ROW(w->node, n), *yr = ROW(w->node, N + n), *zr = ROW(w->node, 2 * N + n);
        int touches = 0;
        for (int l = 0; l < LANES; ++l) touches |= zr[l] - rad - gh < 0;
        if (!touches) {               /* D = 0: the rows stay dead, their J is never read */
            for (int q = 0; q < edges; ++q) LANE_LOOP s->D[base + q][l] = 0;
            continue;
        }
        real dist[LANES], in[LANES], imp[LANES], drow[LANES], pos[LANES];
        real jn[6][LANES], dir[5][6][LANES];
        LANE_LOOP {
            dist[l] = zr[l] - rad - gh;
            in[l] = dist[l] < 0 ? (real)1 : (real)0;
            s->done[l] = dist[l] < 0 ? (real)0 : s->done[l];
            const real lx = xr[l] - px[l], ly = yr[l] - py[l], lz = (zr[l] - (rad + (real)0.5 * dist[l])) - pz[l];
            const int vertical = ax[l] * ax[l] + ay[l] * ay[l] < (real)1e-12;
            real tx = vertical ? (real)0 : ax[l], ty = vertical ? (real)1 : ay[l];
            const real tn = SQRT(tx * tx + ty * ty);
            tx /= tn; ty /= tn;
            const real bx = -ty, by = tx;                            /* e_z x t */
            jn[0][l] = 0; jn[1][l] = 0; jn[2][l] = 1; jn[3][l] = ly; jn[4][l] = -lx; jn[5][l] = 0;  /* [e_z; lever x e_z] */
            dir[0][0][l] = tx; dir[0][1][l] = ty; dir[0][2][l] = 0;  /* slide along t: [t; lever x t] */
            dir[0][3][l] = -lz * ty; dir[0][4][l] = lz * tx; dir[0][5][l] = lx * ty - ly * tx;
            dir[1][0][l] = bx; dir[1][1][l] = by; dir[1][2][l] = 0;  /* slide along b */
            dir[1][3][l] = -lz * by; dir[1][4][l] = lz * bx; dir[1][5][l] = lx * by - ly * bx;
            dir[2][0][l] = 0; dir[2][1][l] = 0; dir[2][2][l] = 0;    /* torsion about e_z */
            dir[2][3][l] = 0; dir[2][4][l] = 0; dir[2][5][l] = 1;
            dir[3][0][l] = 0; dir[3][1][l] = 0; dir[3][2][l] = 0;    /* roll about t, b */
            dir[3][3][l] = tx; dir[3][4][l] = ty; dir[3][5][l] = 0;
            dir[4][0][l] = 0; dir[4][1][l] = 0; dir[4][2][l] = 0;
            dir[4][3][l] = bx; dir[4][4][l] = by; dir[4][5][l] = 0;
        }
        soft_impedance(m, dist, imp, low, high);
        LANE_LOOP {
            drow[l] = in[l] != 0 ? imp[l] / (((real)1 - imp[l]) * reg / mass) : (real)0;
            pos[l] = in[l] != 0 ? soft_k * imp[l] * dist[l] : (real)0;
        }
        for (int q = 0; q < edges; ++q) {
            real (*Jq)[LANES] = s->J[base + q];
            if (nd) {
                const real mu = q & 1 ? -mus[q / 2] : mus[q / 2];
                for (int i = 0; i < 6; ++i) LANE_LOOP Jq[i][l] = jn[i][l] + mu * dir[q / 2][i][l];
            } else {
                for (int i = 0; i < 6; ++i) LANE_LOOP Jq[i][l] = jn[i][l];
            }
            LANE_LOOP {
                const real speed = (real)0 + Jq[0][l] * v0[l] + Jq[1][l] * v1[l] + Jq[2][l] * v2[l]
                                   + Jq[3][l] * v3[l] + Jq[4][l] * v4[l] + Jq[5][l] * v5[l];
                s->aref[base + q][l] = in[l] != 0 ? -soft_b * speed - pos[l] : (real)0;
                s->D[base + q][l] = drow[l];
            }
        }
    }
    const real it = m->inertia_t[r], dia = m->inertia_a[r] - it;
    LANE_LOOP {
        const real x = ax[l], y = ay[l], z = az[l];
        s->Mr[0][0][l] = it + dia * x * x; s->Mr[0][1][l] = dia * x * y; s->Mr[0][2][l] = dia * x * z;
        s->Mr[1][0][l] = dia * y * x; s->Mr[1][1][l] = it + dia * y * y; s->Mr[1][2][l] = dia * y * z;
        s->Mr[2][0][l] = dia * z * x; s->Mr[2][1][l] = dia * z * y; s->Mr[2][2][l] = it + dia * z * z;
    }
    for (int q = 0; q < s->rows; ++q) {
        int live = 0;
        for (int l = 0; l < LANES; ++l) live |= s->D[q][l] > 0;
        s->live[q] = live;
    }
}

#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

/* The minimiser of 1/2 (a - a0)'M(a - a0) + sum 1/2 D min(0, J a - aref)^2 per lane, for
 * the VL lanes from lane o: Newton with an exact line search (as the engine), from s->a. A
 * lane stops once its whole Newton step keeps the active rows it was computed with and the
 * line search would keep it whole (then it is the minimum; the search itself is skipped),
 * or once a step it took whole keeps its rows at the next point, or once its step is
 * rounding; the part once all its lanes have. Lanes never read each other's values, and a
 * lane done earlier than its part keeps the rows it last evaluated (s->set, the next step's
 * start), so a lane's result does not depend on its neighbours: the same in a wide chunk
 * and a narrow one (VL 8 or 4), whichever samples share it. */
static void soft_minimise(soft_rod *restrict s, real mass, int o)
{
    const int rows = s->rows;
    const vreal zero = {0}, one = zero + 1;
    vreal was[SOFT_ROWS];                /* the active rows the Newton step is built with */
    vreal jar[SOFT_ROWS], Js[SOFT_ROWS], J[SOFT_ROWS][6], D[SOFT_ROWS];
    vreal a[6], a0[6], Mr[3][3];
    vreal full = zero;                   /* 1: the last step was whole (alpha 1) */
    vreal done = vload(s->done + o);
    const vreal from_last = vload(s->from_last + o);
    for (int i = 0; i < 6; ++i) { a[i] = vload(s->a[i] + o); a0[i] = vload(s->a0[i] + o); }
    for (int i = 0; i < 3; ++i)
        for (int k = 0; k < 3; ++k) Mr[i][k] = vload(s->Mr[i][k] + o);
    for (int q = 0; q < rows; ++q) {
        was[q] = zero - 1;
        if (!s->live[q]) continue;
        D[q] = vload(s->D[q] + o);
        for (int i = 0; i < 6; ++i) J[q][i] = vload(s->J[q][i] + o);
    }
    for (int it_n = 0; it_n < SOFT_NEWTON; ++it_n) {
        if (!vany(done == 0)) break;
        vreal same = one;
        const vmask none = {0}, use_last = it_n == 0 ? (vmask)(from_last != 0) : none;
        for (int q = 0; q < rows; ++q) {
            if (!s->live[q]) continue;
            const vreal z = SOFT_DOT6(J[q], a, -vload(s->aref[q] + o));
            jar[q] = z;
            const vreal now = vflag((z < 0) & (D[q] > 0));
            const vreal on = vsel(use_last, vsel(D[q] > 0, vload(s->set[q] + o), zero), now);
            same = vsel(on == was[q], same, zero);
            was[q] = vsel(done != 0, was[q], on);    /* a lane done keeps its last rows */
        }
        /* the exact minimum: the last step was the whole Newton step of the rows active
         * here (the minimum of that quadratic piece, and the piece holds) */
        done = vsel((same != 0) & (full != 0), one, done);
        if (!vany(done == 0)) break;
        vreal Mda[6], H[6][6], g[6], step[6];
        {
            const vreal d3 = a[3] - a0[3], d4 = a[4] - a0[4], d5 = a[5] - a0[5];
            for (int i = 0; i < 3; ++i) {
                Mda[i] = mass * (a[i] - a0[i]);
                Mda[3 + i] = Mr[i][0] * d3 + Mr[i][1] * d4 + Mr[i][2] * d5;
            }
        }
        for (int i = 0; i < 6; ++i) {                    /* the lower triangle: the solve reads it */
            g[i] = Mda[i];
            for (int k = 0; k <= i; ++k)
                H[i][k] = i < 3 ? (i == k ? zero + mass : zero) : (k < 3 ? zero : Mr[i - 3][k - 3]);
        }
        for (int q = 0; q < rows; ++q) {
            if (!s->live[q] || !vany(was[q] != 0)) continue;
            const vreal c = vsel(was[q] != 0, D[q], zero);
            for (int i = 0; i < 6; ++i) {
                const vreal cj = c * J[q][i];
                g[i] = VFMA(cj, jar[q], g[i]);
                for (int k = 0; k <= i; ++k) H[i][k] = VFMA(cj, J[q][k], H[i][k]);
            }
        }
        soft_newton_step(H, g, step);
        const vreal s3 = step[3], s4 = step[4], s5 = step[5];
        vreal curv = zero;
        for (int i = 0; i < 3; ++i)
            curv += step[i] * mass * step[i] + step[3 + i] * (Mr[i][0] * s3 + Mr[i][1] * s4 + Mr[i][2] * s5);
        const vreal slope = SOFT_DOT6(step, Mda, zero);
        vreal alpha = one;
        /* a lane whose rows at the whole step are the rows it stepped with is at the exact
         * minimum (of that quadratic piece, and the piece holds): done, no line search */
        vreal keeps = one, first = curv + slope, second = curv;
        for (int q = 0; q < rows; ++q) {
            if (!s->live[q]) continue;
            const vreal js = SOFT_DOT6(J[q], step, zero);
            Js[q] = js;
            const vreal z = jar[q] + js;
            keeps = vsel(vflag((z < 0) & (D[q] > 0)) == was[q], keeps, zero);
            const vreal cjs = vsel(z < 0, D[q], zero) * js;
            first = VFMA(cjs, z, first);
            second = VFMA(cjs, js, second);
        }
        /* ... and the line search would keep alpha 1 (the derivative along the step vanishes
         * there to its tolerance): in float32 a stiff contact's solve is off by up to 1e-2
         * relative, and then the next Newton step, not this one, ends at the minimum */
        keeps = vflag((keeps != 0) & (vabs(first) <= SOFT_ALPHA * second));
        vreal settled = vsel(done != 0, one, keeps);   /* lanes done hold no search up */
        const int search = vany((done == 0) & (keeps == 0));
        for (int ls = 0; search && ls < SOFT_LINE_SEARCH; ++ls) {
            if (ls) {                    /* at alpha 1 (the first round) the check above has them */
                first = alpha * curv + slope;
                second = curv;
                for (int q = 0; q < rows; ++q) {
                    if (!s->live[q]) continue;
                    const vreal z = VFMA(alpha, Js[q], jar[q]);
                    const vreal cjs = vsel(z < 0, D[q], zero) * Js[q];
                    first = VFMA(cjs, z, first);
                    second = VFMA(cjs, Js[q], second);
                }
            }
            /* a zero step keeps alpha */
            vreal al = vsel(second > 0, alpha - first / vsel(second > 0, second, one), alpha);
            al = vsel(al < 0, zero, al);
            /* within one linear piece the next update is rounding: the lane keeps its
             * alpha from then on (its own history alone: lanes stay independent) */
            settled = vsel(vabs(al - alpha) <= SOFT_ALPHA * vsel(al > 1, al, one), one, settled);
            alpha = vsel(settled != 0, alpha, al);
            if (!vany(settled == 0)) break;
        }
        /* the whole step (1 up to rounding; a kink crossed stops it well short) is checked
         * against the next point's rows; a step that is rounding ends it now: the gradient
         * at a (its own active rows) vanishes, whatever a row at z = 0 flickering in float32
         * does to the rows */
        const vreal al = vsel(done != 0, zero, alpha);
        vreal big = one, small = zero;
        for (int i = 0; i < 6; ++i) {
            a[i] += al * step[i];
            const vreal ai = vabs(a[i]), si = vabs(step[i]);
            big = vsel(ai > big, ai, big);
            small = vsel(si > small, si, small);
        }
        full = vflag(vabs(alpha - 1) <= SOFT_ALPHA);
        done = vsel((keeps != 0) | (small <= SOFT_ROUNDING * big), one, done);
    }
    for (int i = 0; i < 6; ++i) vstore(s->a[i] + o, a[i]);
    vstore(s->done + o, done);
    for (int q = 0; q < rows; ++q) vstore(s->set[q] + o, vflag(was[q] > 0));
}
#pragma GCC pop_options

/* Soft ground (SoftGroundContact): per rod, for all lanes at once, the accelerations
 * minimising 1/2 (a - a0)'M(a - a0) + sum 1/2 D min(0, J a - aref)^2 over the pyramid rows
 * of its end spheres, a0 = (acc, alpha) as accelerations() left them. A lane in contact
 * the step (rk4: the stage) before starts from that solution, and its first Newton step uses that
 * step's active rows (the minimum is unique, so this changes only the path): the rows seldom
 * change in 1 ms, and then the first step is exact. Measured on SUPERball rolling, this
 * leaves 80 % of the lanes done after one step, against 56 % with the rows re-evaluated
 * at the last solution (a row at z = 0 there flips with the step's new aref). write_acc: the result into
 * acc / alpha (semi-implicit); else its wrench M (a - a0) into force / torque
 * (implicitfast solves its own update). coupled: the rods of lanes that soft_pairs_solve
 * solved ([R] per lane, or NULL), left alone here (soft_pairs_write replaces them). */
static void soft_ground(const tg_model *m, tg_work *w, int write_acc, const real *coupled)
{
    const int R = m->rods, N = 2 * m->rods;
    const real gh = m->ground_height;
    const real low = soft_power(m->soft_mid, m->soft_power - 1), high = soft_power(1 - m->soft_mid, m->soft_power - 1);
    soft_rod s;
    for (int r = 0; r < R; ++r) {
        const real rad0 = m->node_radius[2 * r], rad1 = m->node_radius[2 * r + 1];
        const real *z0 = ROW(w->node, 2 * N + 2 * r), *z1 = ROW(w->node, 2 * N + 2 * r + 1);
        real *warm = ROW(w->soft_prev, 6 * R + r), skip[LANES];
        LANE_LOOP skip[l] = coupled ? ROW(coupled, r)[l] : (real)0;
        int any = 0;
        for (int l = 0; l < LANES; ++l) any |= ((z0[l] - rad0 - gh < 0) | (z1[l] - rad1 - gh < 0)) & (skip[l] == 0);
        if (!any) { memset(warm, 0, LANES * sizeof(real)); continue; }
        const real mass = m->mass[r], fr = m->free[r];
        soft_rows(m, w, r, &s, low, high);
        LANE_LOOP s.done[l] = skip[l] != 0 ? (real)1 : s.done[l];
        for (int i = 0; i < 3; ++i) {
            const real *acc = ROW(w->acc, i * R + r), *alpha = ROW(w->alpha, i * R + r);
            const real *last_v = ROW(w->soft_prev, i * R + r), *last_w = ROW(w->soft_prev, (3 + i) * R + r);
            LANE_LOOP {
                const real from_last = s.done[l] == 0 && warm[l] != 0;
                s.from_last[l] = from_last;
                s.a0[i][l] = acc[l];
                s.a0[3 + i][l] = alpha[l];
                s.a[i][l] = from_last ? last_v[l] : acc[l];
                s.a[3 + i][l] = from_last ? last_w[l] : alpha[l];
            }
        }
        for (int q = 0; q < s.rows; ++q) {
            const real *set = ROW(w->soft_set, q * R + r);
            LANE_LOOP s.set[q][l] = set[l];
        }
        for (int o = 0; o < LANES; o += VL) soft_minimise(&s, mass, o);
        for (int q = 0; q < s.rows; ++q) {
            real *set = ROW(w->soft_set, q * R + r);
            LANE_LOOP set[l] = s.set[q][l];
        }
        LANE_LOOP warm[l] = s.done[l] != 0 && skip[l] == 0 && (z0[l] - rad0 - gh < 0 || z1[l] - rad1 - gh < 0) ? (real)1 : (real)0;
        for (int i = 0; i < 3; ++i) {
            real *last_v = ROW(w->soft_prev, i * R + r), *last_w = ROW(w->soft_prev, (3 + i) * R + r);
            LANE_LOOP { last_v[l] = s.a[i][l]; last_w[l] = s.a[3 + i][l]; }
            if (write_acc) {
                real *acc = ROW(w->acc, i * R + r), *alpha = ROW(w->alpha, i * R + r);
                LANE_LOOP {
                    acc[l] = m->has_fixed ? s.a[i][l] * fr : s.a[i][l];
                    alpha[l] = m->has_fixed ? s.a[3 + i][l] * fr : s.a[3 + i][l];
                }
            } else {
                real *force = ROW(w->force, i * R + r), *torque = ROW(w->torque, i * R + r);
                LANE_LOOP {
                    const real mt = (real)0 + s.Mr[i][0][l] * (s.a[3][l] - s.a0[3][l]) + s.Mr[i][1][l] * (s.a[4][l] - s.a0[4][l])
                                    + s.Mr[i][2][l] * (s.a[5][l] - s.a0[5][l]);
                    force[l] += mass * (s.a[i][l] - s.a0[i][l]);
                    torque[l] += mt;
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ soft rod pairs */
/* MuJoCo's capsule-capsule contacts under the soft law (soft_pairs.SoftPairRows) couple
 * two rods' problems, so a lane with a pair touching is solved whole: the minimiser of
 * 1/2 (a - a0)'M(a - a0) + sum 1/2 D min(0, J a - aref)^2 over the accelerations of the rods
 * its touching pairs hold (the lane's rods), with their ground rows (as soft_rows builds
 * them) and the pairs' rows. The problem separates by rods: every other rod's minimum is its
 * own ground problem, which soft_ground solves for the other lanes, so it is left out.
 *
 * The lanes of a vector are solved together, in vector types as soft_minimise, over the
 * union of their rods: a slot is one row across the lanes (an edge of a pair's pyramid, or a
 * ground row of a rod), with D = 0 in a lane it is not in (the pair apart there, or the rod
 * not one of the lane's). A rod that is not the lane's has a0 = 0 and no row there, so its
 * unknowns stay exactly 0 and its block of the factor exactly uncoupled: each lane
 * takes the steps it would take alone, and its result does not depend on the rest of its
 * vector (wide and narrow chunks agree, up to a zero's sign). The price: the dense factor is
 * the union's (n = 6 rods of the vector), where lanes touching different pairs would each
 * have solved fewer unknowns. A lane whose rods are the last solve's starts from that
 * solution and its active rows. Measured on a crossed pair of rods that always touch
 * (bench/planning.py --steps 10, MPPI at the paper's sizes in float32, the AVX2 kernel on one
 * thread of an AMD EPYC): 0.298 s per plan solved one lane at a time in scalar code, 0.094 s
 * so (0.020 without rod contacts). */
#define PAIR_EDGES 10                 /* rows of one contact's pyramid at most (condim 6) */
#define PAIR_NEWTON 50
#define PAIR_LINE_SEARCH 30
#define SOFT_PAIR_NEAR ((real)1e-6)   /* m: a lane this close is checked exactly */

typedef struct soft_slot_s {
    int a, b;                         /* rods; b < 0: a ground row on rod a alone */
    int key;                          /* the row's place in pair_set */
    real Ja[6][LANES], Jb[6][LANES], aref[LANES], D[LANES];
} soft_slot;

static size_t soft_slots_max(const tg_model *m)
{
    return (size_t)(m->floor && m->soft_ground ? 2 * m->rods : 0) * PAIR_EDGES + (size_t)m->pairs * PAIR_EDGES;
}

/* every row that can be a slot: each pair's edges, then each rod's ground rows */
static size_t soft_set_keys(const tg_model *m)
{
    return (size_t)m->pairs * PAIR_EDGES + (size_t)m->rods * SOFT_ROWS;
}

/* The solver's vectors for n = 6 R unknowns and every slot: H, g, step, M(a - a0), a, a0,
 * the rods' rotational mass matrices, and per slot the active flags, J a - aref, J step. */
static size_t soft_pairs_scratch(const tg_model *m)
{
    const size_t n = 6 * (size_t)m->rods;
    return n * n + 5 * n + 9 * (size_t)m->rods + 3 * soft_slots_max(m) + 1;
}

/* The coupled solve's work area: the slots, each lane's rods, a0, result and saved wrench,
 * and the solver's vectors (aligned for the vector types). */
static int soft_pairs_alloc(tg_work *w, const tg_model *m)
{
    const size_t R = m->rods, vbytes = sizeof(vreal);
    const size_t bytes = (soft_pairs_scratch(m) * vbytes + 63) / 64 * 64;
    w->pair_slots = malloc(sizeof(soft_slot) * (soft_slots_max(m) + 1));
    w->pair_own = malloc(sizeof(real) * LANES * (26 * R + 1 + soft_set_keys(m)));
    w->pair_vec = aligned_alloc(64, bytes);
    if (!w->pair_slots || !w->pair_own || !w->pair_vec) return -1;
    w->pair_a0 = w->pair_own + LANES * R;
    w->pair_a = w->pair_a0 + 6 * LANES * R;
    w->pair_saved = w->pair_a + 6 * LANES * R;
    w->pair_coupled = w->pair_saved + 6 * LANES * R;
    w->pair_last_own = w->pair_coupled + LANES;
    w->pair_last_a = w->pair_last_own + LANES * R;
    w->pair_set = w->pair_last_a + 6 * LANES * R;
    memset(w->pair_last_own, 0, sizeof(real) * LANES * R);
    return 0;
}

/* Pair p's pyramid rows (SoftPairRows.rows) into the slots from `out`, in every lane where
 * the pair came near (`near`: pair_geometry's depth) and the capsules touch (`touch`: 1,
 * else 0 with D = 0 and zero rows); returns whether any lane touches. */
static int soft_pair_rows(const tg_model *m, tg_work *w, int p, real low, real high, soft_slot *out, real *touch)
{
    const int R = m->rods, N = 2 * R, ia = m->pair_a[p], ib = m->pair_b[p];
    const int na = 2 * ia, nb = 2 * ib;
    const real inv_pair = m->free[ia] / m->mass[ia] + m->free[ib] / m->mass[ib];
    const real ra = m->pair_radius_a[p], rb = m->pair_radius_b[p];
    const real *near = ROW(w->depth, p);
    real dist[LANES], nv[3][LANES], la[3][LANES], lb[3][LANES];
    LANE_LOOP {
        real A0[3], A1[3], B0[3];
        real d1[3], d2[3], r[3];
        for (int i = 0; i < 3; ++i) {
            A0[i] = ROW(w->node, i * N + na)[l]; A1[i] = ROW(w->node, i * N + na + 1)[l];
            B0[i] = ROW(w->node, i * N + nb)[l];
            d1[i] = A1[i] - A0[i]; d2[i] = ROW(w->node, i * N + nb + 1)[l] - B0[i]; r[i] = A0[i] - B0[i];
        }
        /* closest points of the axis segments (collision.segment_closest_points) */
        const real a = d1[0] * d1[0] + d1[1] * d1[1] + d1[2] * d1[2];
        const real e = d2[0] * d2[0] + d2[1] * d2[1] + d2[2] * d2[2];
        const real f = d2[0] * r[0] + d2[1] * r[1] + d2[2] * r[2];
        const real c = d1[0] * r[0] + d1[1] * r[1] + d1[2] * r[2];
        const real b = d1[0] * d2[0] + d1[1] * d2[1] + d1[2] * d2[2];
        const real denom = a * e - b * b;
        const int parallel = denom <= (real)1e-9 * a * e;
        real sa = clamp01(parallel ? (real)0 : (b * f - c * e) / denom);
        const real t = (b * sa + f) / e, tc = clamp01(t);
        sa = t != tc ? clamp01((b * tc - c) / a) : sa;
        real pa[3], g[3];
        for (int i = 0; i < 3; ++i) { pa[i] = A0[i] + sa * d1[i]; g[i] = (B0[i] + tc * d2[i]) - pa[i]; }
        real len2 = g[0] * g[0] + g[1] * g[1] + g[2] * g[2];
        len2 = len2 < (real)1e-30 ? (real)1e-30 : len2;
        const real len = SQRT(len2);
        dist[l] = len - ra - rb;
        touch[l] = near[l] > -SOFT_PAIR_NEAR && dist[l] < 0 && inv_pair > 0 ? (real)1 : (real)0;
        for (int i = 0; i < 3; ++i) {
            nv[i][l] = g[i] / len;
            const real pt = pa[i] + (ra + (real)0.5 * dist[l]) * nv[i][l];
            la[i][l] = pt - ROW(w->st, i * R + ia)[l];
            lb[i][l] = pt - ROW(w->st, i * R + ib)[l];
        }
    }
    int any = 0;
    for (int l = 0; l < LANES; ++l) any |= touch[l] != 0;
    if (!any) return 0;
    /* rows on (a's velocities, b's): a point direction d is [-d, -la x d | d, lb x d], an
     * angular one [0, -d | 0, d]; directions n, t, b of MuJoCo's frame, then torsion about n
     * and rolling about t, b */
    real frame[3][3][LANES], dirs[6][12][LANES], imp[LANES], drow[LANES], pos[LANES], tw[12][LANES];
    soft_impedance(m, dist, imp, low, high);
    LANE_LOOP {
        const real n0 = nv[0][l], n1 = nv[1][l], n2 = nv[2][l];
        /* mju_makeFrame: (0, 1, 0), or (0, 0, 1) within 60 degrees of the normal */
        const real side = FABS(n1) < (real)0.5 ? (real)1 : (real)0;
        const real sn = n1 * side + n2 * (1 - side);
        real t0 = -sn * n0, t1 = side - sn * n1, t2 = (1 - side) - sn * n2;
        const real tn = SQRT(t0 * t0 + t1 * t1 + t2 * t2);
        t0 /= tn; t1 /= tn; t2 /= tn;
        frame[0][0][l] = n0; frame[0][1][l] = n1; frame[0][2][l] = n2;
        frame[1][0][l] = t0; frame[1][1][l] = t1; frame[1][2][l] = t2;
        frame[2][0][l] = n1 * t2 - n2 * t1; frame[2][1][l] = n2 * t0 - n0 * t2; frame[2][2][l] = n0 * t1 - n1 * t0;
        drow[l] = imp[l] / (((real)1 - imp[l]) * m->soft_reg * inv_pair);
        pos[l] = m->soft_k * imp[l] * dist[l];
        for (int i = 0; i < 3; ++i) {
            tw[i][l] = ROW(w->st, (7 + i) * R + ia)[l]; tw[3 + i][l] = ROW(w->st, (10 + i) * R + ia)[l];
            tw[6 + i][l] = ROW(w->st, (7 + i) * R + ib)[l]; tw[9 + i][l] = ROW(w->st, (10 + i) * R + ib)[l];
        }
    }
    for (int k = 0; k < 3; ++k) {
        real (*d)[LANES] = frame[k], (*o)[LANES] = dirs[k], (*ang)[LANES] = dirs[3 + k];
        LANE_LOOP {
            o[0][l] = -d[0][l]; o[1][l] = -d[1][l]; o[2][l] = -d[2][l];
            o[3][l] = -(la[1][l] * d[2][l] - la[2][l] * d[1][l]); o[4][l] = -(la[2][l] * d[0][l] - la[0][l] * d[2][l]);
            o[5][l] = -(la[0][l] * d[1][l] - la[1][l] * d[0][l]);
            o[6][l] = d[0][l]; o[7][l] = d[1][l]; o[8][l] = d[2][l];
            o[9][l] = lb[1][l] * d[2][l] - lb[2][l] * d[1][l]; o[10][l] = lb[2][l] * d[0][l] - lb[0][l] * d[2][l];
            o[11][l] = lb[0][l] * d[1][l] - lb[1][l] * d[0][l];
            for (int i = 0; i < 3; ++i) {
                ang[i][l] = 0; ang[3 + i][l] = -d[i][l];
                ang[6 + i][l] = 0; ang[9 + i][l] = d[i][l];
            }
        }
    }
    const int condim = m->soft_condim;
    const int nd = condim == 6 ? 5 : condim == 4 ? 3 : condim == 3 ? 2 : 0;
    const real mus[5] = {m->mu, m->mu, m->mu_torsional, m->mu_rolling, m->mu_rolling};
    const int edges = nd ? 2 * nd : 1;
    for (int q = 0; q < edges; ++q) {
        const real mu = nd ? (q & 1 ? -mus[q / 2] : mus[q / 2]) : (real)0;
        const int dir = nd ? 1 + q / 2 : 0;          /* the cone's direction among dirs */
        soft_slot *row = out + q;
        LANE_LOOP {
            real J[12], speed = 0;
            for (int i = 0; i < 12; ++i) {
                J[i] = nd ? dirs[0][i][l] + mu * dirs[dir][i][l] : dirs[0][i][l];
                speed += J[i] * tw[i][l];
            }
            const int in = touch[l] != 0;
            for (int i = 0; i < 6; ++i) {
                row->Ja[i][l] = in ? J[i] * m->free[ia] : (real)0;
                row->Jb[i][l] = in ? J[6 + i] * m->free[ib] : (real)0;
            }
            row->aref[l] = in ? -m->soft_b * speed - pos[l] : (real)0;
            row->D[l] = in ? drow[l] : (real)0;
        }
    }
    return 1;
}

/* a * b + c rounded once, in every lane (one instruction where the target has FMA) */
static inline vreal vfma(vreal a, vreal b, vreal c)
{
    vreal y;
    for (int l = 0; l < (int)VL; ++l) y[l] = FMA(a[l], b[l], c[l]);
    return y;
}

/* The solver fuses exactly where it says (vfma) and nowhere else: GCC's contraction of the
 * rest depends on the vector's width where the tuning avoids FMA chains (AMD's, up to 256
 * bits), and a lane solved in a 512-bit vector then rounded otherwise than in a 256-bit one
 * (1e-14 m in float64), so its result depended on its chunk. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

/* x = H^-1 x in place, H [n][n] symmetric positive definite (its lower triangle read and
 * overwritten by its L D L' factor: L below the diagonal, 1 / D on it). Right-looking: each
 * column, once final, updates the rest of the matrix and of x, updates independent of each
 * other (a left-looking inner product is one chain of FMAs, latency-bound at these sizes);
 * no square roots, so a column's chain is one division. A zero block of H stays a zero
 * block of the factor (0 * 1/d, h - 0 * l), so uncoupled unknowns stay uncoupled. */
static void pair_ldl_solve(vreal *restrict H, int n, vreal *restrict x)
{
    for (int j = 0; j < n; ++j) {
        const vreal inv = 1 / H[j * n + j];
        H[j * n + j] = inv;
        const vreal xj = x[j];
        for (int i = j + 1; i < n; ++i) {              /* column j still l_cj d_j here */
            const vreal lij = H[i * n + j] * inv;
            vreal *row = H + (size_t)i * n;
            for (int c = j + 1; c <= i; ++c) row[c] = vfma(-lij, H[c * n + j], row[c]);
            x[i] = vfma(-lij, xj, x[i]);
        }
        for (int i = j + 1; i < n; ++i) H[i * n + j] *= inv;
    }
    for (int i = 0; i < n; ++i) x[i] *= H[i * n + i];
    for (int i = n - 1; i > 0; --i) {
        const vreal xi = -x[i];
        for (int k = 0; k < i; ++k) x[k] = vfma(H[i * n + k], xi, x[k]);
    }
}

/* J a for slot s's rows, the rods at places pa, pb (pb < 0: a ground row) */
static inline vreal pair_slot_dot(const soft_slot *s, int o, int pa, int pb, const vreal *v)
{
    vreal z = {0};
    for (int i = 0; i < 6; ++i) z = vfma(vload(s->Ja[i] + o), v[6 * pa + i], z);
    if (pb >= 0)
        for (int i = 0; i < 6; ++i) z = vfma(vload(s->Jb[i] + o), v[6 * pb + i], z);
    return z;
}

/* M v for the block-diagonal mass matrix of the k rods (mass, world inertia Mr) */
static inline void pair_mass_times(const real *mass, const vreal *Mr, int k, const vreal *v, vreal *out)
{
    for (int j = 0; j < k; ++j) {
        const vreal *u = v + 6 * j, *R3 = Mr + 9 * j;
        for (int i = 0; i < 3; ++i) {
            out[6 * j + i] = mass[j] * u[i];
            out[6 * j + 3 + i] = vfma(R3[3 * i + 2], u[5], vfma(R3[3 * i + 1], u[4], R3[3 * i] * u[3]));
        }
    }
}

/* The coupled minimum for the VL lanes from lane o over the k rods rod[0..k) (place: each
 * rod's place in that list) and the `count` slots slot[0..count): Newton with an exact line
 * search, each lane stopping as soft_minimise's do. A lane whose rods are the last solve's
 * (warm) starts, as soft_ground's, from that solution and that solve's active rows; any
 * other from a0. Reads pair_a0, pair_coupled and the last solve; writes pair_a and the
 * lanes' pair_set. */
static void pair_minimise(const tg_model *m, tg_work *w, int o, int k, const int *rod, const int *place,
                          int count, const soft_slot *const *slot, const real *warm)
{
    const int R = m->rods, n = 6 * k;
    const vreal zero = {0}, one = zero + 1;
    vreal *H = w->pair_vec, *g = H + n * n, *step = g + n, *Mda = step + n, *a = Mda + n, *a0 = a + n;
    vreal *Mr = a0 + n, *was = Mr + 9 * k, *jar = was + count, *Js = jar + count;
    real mass[R > 0 ? R : 1];
    int pa[count > 0 ? count : 1], pb[count > 0 ? count : 1];
    for (int j = 0; j < k; ++j) {
        const int r = rod[j];
        const real it = m->inertia_t[r], dia = m->inertia_a[r] - it;
        const vreal ax[3] = {vload(ROW(w->axis, r) + o), vload(ROW(w->axis, R + r) + o), vload(ROW(w->axis, 2 * R + r) + o)};
        mass[j] = m->mass[r];
        for (int i = 0; i < 3; ++i)
            for (int c = 0; c < 3; ++c) Mr[9 * j + 3 * i + c] = (i == c ? zero + it : zero) + dia * ax[i] * ax[c];
        const vmask from_last = (vload(warm + o) != 0) & (vload(ROW(w->pair_own, r) + o) != 0);
        for (int i = 0; i < 6; ++i) {
            a0[6 * j + i] = vload(ROW(w->pair_a0, i * R + r) + o);
            a[6 * j + i] = vsel(from_last, vload(ROW(w->pair_last_a, i * R + r) + o), a0[6 * j + i]);
        }
    }
    for (int q = 0; q < count; ++q) {
        pa[q] = place[slot[q]->a];
        pb[q] = slot[q]->b >= 0 ? place[slot[q]->b] : -1;
        was[q] = zero - 1;
        Js[q] = vload(ROW(w->pair_set, slot[q]->key) + o);   /* until the first line search */
    }
    vreal done = vflag(vload(w->pair_coupled + o) == 0), full = zero;
    const vmask use_warm = vload(warm + o) != 0, none = {0};
    for (int it_n = 0; it_n < PAIR_NEWTON; ++it_n) {
        if (!vany(done == 0)) break;
        vreal same = one;
        const vmask use_last = it_n == 0 ? use_warm : none;
        for (int q = 0; q < count; ++q) {
            const vreal z = pair_slot_dot(slot[q], o, pa[q], pb[q], a) - vload(slot[q]->aref + o);
            const vreal D = vload(slot[q]->D + o);
            jar[q] = z;
            const vreal on = vsel(use_last, vsel(D > 0, Js[q], zero), vflag((z < 0) & (D > 0)));
            same = vsel(on == was[q], same, zero);
            was[q] = vsel(done != 0, was[q], on);        /* a lane done keeps its last rows */
        }
        /* the exact minimum: the last step was the whole Newton step of the rows active here */
        done = vsel((same != 0) & (full != 0), one, done);
        if (!vany(done == 0)) break;
        for (int i = 0; i < n; ++i) step[i] = a[i] - a0[i];
        pair_mass_times(mass, Mr, k, step, Mda);
        for (int i = 0; i < n; ++i) {
            g[i] = Mda[i];
            for (int c = 0; c <= i; ++c) H[i * n + c] = zero;
        }
        for (int j = 0; j < k; ++j)
            for (int i = 0; i < 3; ++i) {
                H[(6 * j + i) * n + 6 * j + i] = zero + mass[j];
                for (int c = 0; c <= i; ++c) H[(6 * j + 3 + i) * n + 6 * j + 3 + c] = Mr[9 * j + 3 * i + c];
            }
        for (int q = 0; q < count; ++q) {
            if (!vany(was[q] != 0)) continue;
            const vreal cd = vsel(was[q] != 0, vload(slot[q]->D + o), zero);
            /* lo: the block of the rod placed first, hi: the other's (a pair's) */
            const int two = pb[q] >= 0, swap = two && pb[q] < pa[q];
            const int lo = 6 * (swap ? pb[q] : pa[q]), hi = 6 * (swap ? pa[q] : pb[q]);
            vreal Jl[6], Jh[6];
            for (int i = 0; i < 6; ++i) {
                Jl[i] = vload((swap ? slot[q]->Jb[i] : slot[q]->Ja[i]) + o);
                Jh[i] = two ? vload((swap ? slot[q]->Ja[i] : slot[q]->Jb[i]) + o) : zero;
            }
            for (int i = 0; i < 6; ++i) {
                const vreal cj = cd * Jl[i];
                vreal *Hrow = H + (size_t)(lo + i) * n + lo;
                g[lo + i] = vfma(cj, jar[q], g[lo + i]);
                for (int c = 0; c <= i; ++c) Hrow[c] = vfma(cj, Jl[c], Hrow[c]);
            }
            if (!two) continue;
            for (int i = 0; i < 6; ++i) {
                const vreal cj = cd * Jh[i];
                vreal *Hlo = H + (size_t)(hi + i) * n + lo, *Hhi = H + (size_t)(hi + i) * n + hi;
                g[hi + i] = vfma(cj, jar[q], g[hi + i]);
                for (int c = 0; c < 6; ++c) Hlo[c] = vfma(cj, Jl[c], Hlo[c]);
                for (int c = 0; c <= i; ++c) Hhi[c] = vfma(cj, Jh[c], Hhi[c]);
            }
        }
        for (int i = 0; i < n; ++i) step[i] = -g[i];
        pair_ldl_solve(H, n, step);
        vreal curv = zero, slope = zero;
        pair_mass_times(mass, Mr, k, step, g);          /* g: M step from here on */
        for (int i = 0; i < n; ++i) { curv = vfma(step[i], g[i], curv); slope = vfma(step[i], Mda[i], slope); }
        /* a lane whose rows at the whole step are the rows it stepped with, and whose
         * derivative along the step vanishes there, is at the exact minimum: done */
        vreal keeps = one, first = curv + slope, second = curv;
        for (int q = 0; q < count; ++q) {
            const vreal js = pair_slot_dot(slot[q], o, pa[q], pb[q], step), D = vload(slot[q]->D + o);
            Js[q] = js;
            const vreal z = jar[q] + js;
            keeps = vsel(vflag((z < 0) & (D > 0)) == was[q], keeps, zero);
            const vreal cjs = vsel(z < 0, D, zero) * js;
            first = vfma(cjs, z, first);
            second = vfma(cjs, js, second);
        }
        keeps = vflag((keeps != 0) & (vabs(first) <= SOFT_ALPHA * second));
        /* the derivative along the step is piecewise linear and increasing: Newton on it is
         * exact within a piece but can cycle between two, so it keeps a bracket [lo, hi] of
         * the minimum and bisects where it would leave it (unbracketed, one search in six on
         * a crossed pair of rods ran all PAIR_LINE_SEARCH rounds) */
        vreal settled = vsel(done != 0, one, keeps), alpha = one, lo = zero, hi = zero + (real)1e30;
        const int search = vany((done == 0) & (keeps == 0));
        for (int ls = 0; search && ls < PAIR_LINE_SEARCH; ++ls) {
            if (ls) {
                first = vfma(alpha, curv, slope);
                second = curv;
                for (int q = 0; q < count; ++q) {
                    const vreal z = vfma(alpha, Js[q], jar[q]);
                    const vreal cjs = vsel(z < 0, vload(slot[q]->D + o), zero) * Js[q];
                    first = vfma(cjs, z, first);
                    second = vfma(cjs, Js[q], second);
                }
            }
            lo = vsel(first < 0, alpha, lo);
            hi = vsel(first > 0, alpha, hi);
            vreal al = vsel(second > 0, alpha - first / vsel(second > 0, second, one), alpha);
            al = vsel((al < lo) | (al > hi), (real)0.5 * (lo + hi), al);    /* hi is finite then */
            settled = vsel(vabs(al - alpha) <= SOFT_ALPHA * vsel(al > 1, al, one), one, settled);
            alpha = vsel(settled != 0, alpha, al);
            if (!vany(settled == 0)) break;
        }
        const vreal al = vsel(done != 0, zero, alpha);
        vreal big = one, small = zero;
        for (int i = 0; i < n; ++i) {
            a[i] = vfma(al, step[i], a[i]);
            const vreal ai = vabs(a[i]), si = vabs(step[i]);
            big = vsel(ai > big, ai, big);
            small = vsel(si > small, si, small);
        }
        full = vflag(vabs(alpha - 1) <= SOFT_ALPHA);
        done = vsel((keeps != 0) | (small <= SOFT_ROUNDING * big), one, done);
    }
    for (int j = 0; j < k; ++j)
        for (int i = 0; i < 6; ++i) vstore(ROW(w->pair_a, i * R + rod[j]) + o, a[6 * j + i]);
    /* the rows of these lanes: the slots' as they ended, every other row off (a row no slot
     * had here is read as off, whichever other lanes made slots) */
    for (size_t key = 0; key < soft_set_keys(m); ++key) vstore(ROW(w->pair_set, key) + o, zero);
    for (int q = 0; q < count; ++q) vstore(ROW(w->pair_set, slot[q]->key) + o, vflag(was[q] > 0));
}
#pragma GCC pop_options

/* No lane coupled: none starts the next solve from this one. */
static int soft_pairs_none(const tg_model *m, tg_work *w)
{
    memset(w->pair_last_own, 0, sizeof(real) * LANES * m->rods);
    return 0;
}

/* Lanes with a rod pair touching: their rods (pair_own), a0 = (acc, alpha) and the force
 * and torque before the ground, the slots (the touching pairs' rows and their rods' ground
 * rows when the floor is soft), and the coupled minimum of each vector of lanes; returns
 * whether any lane is coupled. soft_pairs_write puts the result in. */
static int soft_pairs_solve(const tg_model *m, tg_work *w, real low, real high)
{
    const int R = m->rods, P = m->pairs;
    const int nd = m->soft_condim == 6 ? 5 : m->soft_condim == 4 ? 3 : m->soft_condim == 3 ? 2 : 0;
    const int edges = nd ? 2 * nd : 1;
    /* the penalty law's vector geometry finds the lanes that come near (its distance has a
     * 1e-12 m^2 softening: a margin far above it and rounding); the rows decide exactly */
    if (!pair_geometry(m, w, SOFT_PAIR_NEAR)) return soft_pairs_none(m, w);
    soft_slot *slots = w->pair_slots;
    int count = 0;
    memset(w->pair_own, 0, sizeof(real) * LANES * R);
    for (int p = 0; p < P; ++p) {
        if (!w->pair_touch[p]) continue;
        soft_slot *out = slots + count;
        real touch[LANES];
        if (!soft_pair_rows(m, w, p, low, high, out, touch)) continue;
        real *own_a = ROW(w->pair_own, m->pair_a[p]), *own_b = ROW(w->pair_own, m->pair_b[p]);
        LANE_LOOP {
            own_a[l] = touch[l] != 0 ? (real)1 : own_a[l];
            own_b[l] = touch[l] != 0 ? (real)1 : own_b[l];
        }
        for (int q = 0; q < edges; ++q) { out[q].a = m->pair_a[p]; out[q].b = m->pair_b[p]; out[q].key = p * PAIR_EDGES + q; }
        count += edges;
    }
    if (!count) return soft_pairs_none(m, w);
    real *coupled = w->pair_coupled, warm[LANES];
    LANE_LOOP { coupled[l] = 0; warm[l] = 1; }
    for (int r = 0; r < R; ++r) {
        const real *own = ROW(w->pair_own, r);
        int any = 0;
        for (int l = 0; l < LANES; ++l) any |= own[l] != 0;
        const real *last = ROW(w->pair_last_own, r);
        LANE_LOOP warm[l] = last[l] != own[l] ? (real)0 : warm[l];
        if (!any) continue;
        LANE_LOOP coupled[l] = own[l] != 0 ? (real)1 : coupled[l];
        /* a0 is 0 in a lane the rod is not in: its unknowns stay 0 there */
        for (int i = 0; i < 3; ++i) {
            const real *acc = ROW(w->acc, i * R + r), *alpha = ROW(w->alpha, i * R + r);
            real *a0 = ROW(w->pair_a0, i * R + r), *b0 = ROW(w->pair_a0, (3 + i) * R + r);
            LANE_LOOP { a0[l] = own[l] != 0 ? acc[l] : (real)0; b0[l] = own[l] != 0 ? alpha[l] : (real)0; }
            memcpy(ROW(w->pair_saved, i * R + r), ROW(w->force, i * R + r), LANES * sizeof(real));
            memcpy(ROW(w->pair_saved, (3 + i) * R + r), ROW(w->torque, i * R + r), LANES * sizeof(real));
        }
        if (!(m->floor && m->soft_ground)) continue;
        soft_rod s;
        soft_rows(m, w, r, &s, low, high);
        for (int q = 0; q < s.rows; ++q) {
            int live = 0;
            for (int l = 0; l < LANES; ++l) live |= own[l] != 0 && s.D[q][l] > 0;
            if (!live) continue;
            soft_slot *row = slots + count++;
            row->a = r; row->b = -1; row->key = m->pairs * PAIR_EDGES + r * SOFT_ROWS + q;
            for (int i = 0; i < 6; ++i)
                LANE_LOOP { row->Ja[i][l] = s.J[q][i][l] * m->free[r]; row->Jb[i][l] = 0; }
            LANE_LOOP {
                const int in = own[l] != 0 && s.D[q][l] > 0;
                row->aref[l] = in ? s.aref[q][l] : (real)0;
                row->D[l] = in ? s.D[q][l] : (real)0;
            }
        }
    }
    /* each vector of lanes over the rods of its lanes, numbered in rod order, and the slots
     * live in it */
    for (int o = 0; o < LANES; o += VL) {
        int rod[R > 0 ? R : 1], place[R > 0 ? R : 1], k = 0, live = 0;
        const soft_slot *part[count];
        for (int r = 0; r < R; ++r) {
            int in = 0;
            for (int l = o; l < o + (int)VL; ++l) in |= ROW(w->pair_own, r)[l] != 0;
            place[r] = in ? k : -1;
            if (in) rod[k++] = r;
        }
        if (!k) continue;
        for (int q = 0; q < count; ++q) {
            int in = 0;
            for (int l = o; l < o + (int)VL; ++l) in |= slots[q].D[l] > 0;
            if (in) part[live++] = slots + q;
        }
        pair_minimise(m, w, o, k, rod, place, live, part, warm);
    }
    memcpy(w->pair_last_own, w->pair_own, sizeof(real) * LANES * R);
    memcpy(w->pair_last_a, w->pair_a, sizeof(real) * 6 * LANES * R);
    return 1;
}

/* The coupled lanes' result over what soft_ground left, for each lane's rods (every other
 * rod keeps soft_ground's, its own minimum): accelerations (write_acc), or the force and
 * torque before the ground plus the contacts' wrench M (a - a0). */
static void soft_pairs_write(const tg_model *m, tg_work *w, int write_acc)
{
    const int R = m->rods;
    for (int r = 0; r < R; ++r) {
        const real *own = ROW(w->pair_own, r);
        int any = 0;
        for (int l = 0; l < LANES; ++l) any |= own[l] != 0;
        if (!any) continue;
        const real fr = m->has_fixed ? m->free[r] : (real)1;
        const real *a[6], *a0[6];
        for (int i = 0; i < 6; ++i) { a[i] = ROW(w->pair_a, i * R + r); a0[i] = ROW(w->pair_a0, i * R + r); }
        if (write_acc) {
            for (int i = 0; i < 3; ++i) {
                real *acc = ROW(w->acc, i * R + r), *alpha = ROW(w->alpha, i * R + r);
                LANE_LOOP {
                    acc[l] = own[l] != 0 ? (m->has_fixed ? a[i][l] * fr : a[i][l]) : acc[l];
                    alpha[l] = own[l] != 0 ? (m->has_fixed ? a[3 + i][l] * fr : a[3 + i][l]) : alpha[l];
                }
            }
            continue;
        }
        const real it = m->inertia_t[r], dia = m->inertia_a[r] - it, mass = m->mass[r];
        const real *ax = ROW(w->axis, r), *ay = ROW(w->axis, R + r), *az = ROW(w->axis, 2 * R + r);
        LANE_LOOP {
            if (own[l] == 0) continue;
            const real d3 = a[3][l] - a0[3][l], d4 = a[4][l] - a0[4][l], d5 = a[5][l] - a0[5][l];
            const real along = dia * (ax[l] * d3 + ay[l] * d4 + az[l] * d5);
            const real axl[3] = {ax[l], ay[l], az[l]}, d[3] = {d3, d4, d5};
            for (int i = 0; i < 3; ++i) {
                ROW(w->force, i * R + r)[l] = ROW(w->pair_saved, i * R + r)[l] + mass * (a[i][l] - a0[i][l]);
                ROW(w->torque, i * R + r)[l] = ROW(w->pair_saved, (3 + i) * R + r)[l] + (it * d[i] + along * axl[i]);
            }
        }
    }
}

/* Velocity-implicit smooth Coulomb sliding friction at the ground contacts
 * (ForceModel.ground_friction with a step h), added to force and torque. */
static void ground_friction(const tg_model *m, tg_work *w)
{
    const int R = m->rods, N = 2 * m->rods;
    const real h = m->h, mu = m->mu, eps2 = m->friction_eps2;
    for (int r = 0; r < R; ++r) {
        const real *a0 = ROW(w->acc, r), *a1 = ROW(w->acc, R + r);
        const real *b0 = ROW(w->alpha, r), *b1 = ROW(w->alpha, R + r), *b2 = ROW(w->alpha, 2 * R + r);
        real *f0 = ROW(w->force, r), *f1 = ROW(w->force, R + r);
        real *t0 = ROW(w->torque, r), *t1 = ROW(w->torque, R + r), *t2 = ROW(w->torque, 2 * R + r);
        const real *n[2], *sx[2], *sy[2], *lx[2], *ly[2], *lz[2];
        real inv_mass[2];
        for (int e = 0; e < 2; ++e) {
            const int k = 2 * r + e;
            n[e] = ROW(w->normal, k); sx[e] = ROW(w->slip_x, k); sy[e] = ROW(w->slip_y, k);
            lx[e] = ROW(w->lever, k); ly[e] = ROW(w->lever, N + k); lz[e] = ROW(w->lever, 2 * N + k);
            inv_mass[e] = m->node_inv_mass[k];
        }
        LANE_LOOP {
            real fx[2], fy[2];
            for (int e = 0; e < 2; ++e) {
                const real acx = a0[l] + (b1[l] * lz[e][l] - b2[l] * ly[e][l]);
                const real acy = a1[l] + (b2[l] * lx[e][l] - b0[l] * lz[e][l]);
                const real vx = sx[e][l] + h * acx, vy = sy[e][l] + h * acy;
                const real speed = SQRT(vx * vx + vy * vy + eps2);
                real coef = mu * n[e][l] / speed;
                coef = coef / ((real)1 + h * coef * inv_mass[e]);
                fx[e] = -coef * vx;
                fy[e] = -coef * vy;
            }
            f0[l] = f0[l] + (fx[0] + fx[1]);
            f1[l] = f1[l] + (fy[0] + fy[1]);
            t0[l] = t0[l] + ((-lz[0][l] * fy[0]) + (-lz[1][l] * fy[1]));
            t1[l] = t1[l] + (lz[0][l] * fx[0] + lz[1][l] * fx[1]);
            t2[l] = t2[l] + ((lx[0][l] * fy[0] - ly[0][l] * fx[0]) + (lx[1][l] * fy[1] - ly[1][l] * fx[1]));
        }
    }
}

/* cos(x) and sin(x)/x by their Taylor series in z = x^2, exact to rounding for
 * x <= SMALL_ANGLE (the first term left out is below 1e-22 in float64, 4e-10 in float32);
 * larger angles call libm. */
#define SMALL_ANGLE 0.25
#ifdef TG_FLOAT
static inline real cos_series(real z)
{
    return 1 + z * ((real)(-1.0 / 2) + z * ((real)(1.0 / 24) + z * (real)(-1.0 / 720)));
}
static inline real sinc_series(real z)
{
    return 1 + z * ((real)(-1.0 / 6) + z * ((real)(1.0 / 120) + z * (real)(-1.0 / 5040)));
}
#else
static inline real cos_series(real z)
{
    return 1 + z * ((real)(-1.0 / 2) + z * ((real)(1.0 / 24) + z * ((real)(-1.0 / 720)
           + z * ((real)(1.0 / 40320) + z * ((real)(-1.0 / 3628800) + z * ((real)(1.0 / 479001600)
           + z * (real)(-1.0 / 87178291200.0)))))));
}
static inline real sinc_series(real z)
{
    return 1 + z * ((real)(-1.0 / 6) + z * ((real)(1.0 / 120) + z * ((real)(-1.0 / 5040)
           + z * ((real)(1.0 / 362880) + z * ((real)(-1.0 / 39916800) + z * ((real)(1.0 / 6227020800.0)
           + z * (real)(-1.0 / 1307674368000.0)))))));
}
#endif

/* v+ = v + h a, w+ = w + h alpha; p+ = p + h v+; q+ = exp(h w+ / 2) q, renormalised. */
/* q_out = exp(half w) q_in, normalised, per lane (RigidRods.advance's orientation update:
 * half = h / 2 of the step it turns over); q_out may be q_in. */
static void rotate(real *const q_out[4], const real *const q_in[4], const real *const w[3], real half)
{
    real angle[LANES], dw[LANES], sinc[LANES];
    int large = 0;
    _Pragma("omp simd reduction(|:large)")
    for (int l = 0; l < LANES; ++l) {
        const real x0 = half * w[0][l], x1 = half * w[1][l], x2 = half * w[2][l];
        const real z = x0 * x0 + x1 * x1 + x2 * x2 + (real)1e-30;
        angle[l] = SQRT(z);
        dw[l] = cos_series(z);
        sinc[l] = sinc_series(z);
        large |= angle[l] > (real)SMALL_ANGLE;
    }
    if (large) {
        for (int l = 0; l < LANES; ++l) {
            if (angle[l] > (real)SMALL_ANGLE) {
                /* torch.sinc(angle / pi) = sin(pi x) / (pi x) */
                const real x = angle[l] / (real)TG_PI;
                const real prod = (real)TG_PI * x;
                dw[l] = COS(angle[l]);
                sinc[l] = SIN(prod) / prod;
            }
        }
    }
    LANE_LOOP {
        const real x0 = half * w[0][l], x1 = half * w[1][l], x2 = half * w[2][l];
        const real dv0 = x0 * sinc[l], dv1 = x1 * sinc[l], dv2 = x2 * sinc[l];
        const real qw = q_in[0][l], q0 = q_in[1][l], q1 = q_in[2][l], q2 = q_in[3][l];
        const real nw = dw[l] * qw - (dv0 * q0 + dv1 * q1 + dv2 * q2);
        const real n0 = (dw[l] * q0 + qw * dv0) + (dv1 * q2 - dv2 * q1);
        const real n1 = (dw[l] * q1 + qw * dv1) + (dv2 * q0 - dv0 * q2);
        const real n2 = (dw[l] * q2 + qw * dv2) + (dv0 * q1 - dv1 * q0);
        const real norm = SQRT(nw * nw + (n0 * n0 + n1 * n1 + n2 * n2));
        q_out[0][l] = nw / norm; q_out[1][l] = n0 / norm; q_out[2][l] = n1 / norm; q_out[3][l] = n2 / norm;
    }
}

static void advance(const tg_model *m, tg_work *w)
{
    const int R = m->rods;
    const real h = m->h, half_h = m->half_h;
    const int fixed = m->has_fixed;
    for (int r = 0; r < R; ++r) {
        real *s[13];
        for (int k = 0; k < 13; ++k) s[k] = ROW(w->st, k * R + r);
        const real *a0 = ROW(w->acc, r), *a1 = ROW(w->acc, R + r), *a2 = ROW(w->acc, 2 * R + r);
        const real *b0 = ROW(w->alpha, r), *b1 = ROW(w->alpha, R + r), *b2 = ROW(w->alpha, 2 * R + r);
        const real fr = m->free[r];
        LANE_LOOP {
            real v0 = s[7][l] + h * a0[l], v1 = s[8][l] + h * a1[l], v2 = s[9][l] + h * a2[l];
            real w0 = s[10][l] + h * b0[l], w1 = s[11][l] + h * b1[l], w2 = s[12][l] + h * b2[l];
            if (fixed) {
                v0 = v0 * fr; v1 = v1 * fr; v2 = v2 * fr;
                w0 = w0 * fr; w1 = w1 * fr; w2 = w2 * fr;
            }
            s[0][l] = s[0][l] + h * v0; s[1][l] = s[1][l] + h * v1; s[2][l] = s[2][l] + h * v2;
            s[7][l] = v0; s[8][l] = v1; s[9][l] = v2;
            s[10][l] = w0; s[11][l] = w1; s[12][l] = w2;
        }
        rotate(s + 3, (const real *const *)(s + 3), (const real *const *)(s + 10), half_h);
    }
}

/* ------------------------------------------------------------------ driver */

/* Rate-limited first-order actuator filter over the step (actuator_update: a linear phase
 * at top speed for t1, then exponential) and the rest lengths it gives (rest_lengths):
 * act_end for the next step, rest from act or the step's mean. */
/* exp(x) for -0.5 <= x <= 0 by its Taylor series (the next term is 2e-20 at most, within a
 * rounding of libm's exp, measured), in vector
 * code: a libm call in a lane loop leaves the whole loop scalar. */
#define EXP_SERIES_LIMIT ((real)-0.5)
static inline real exp_series(real x)
{
    return 1 + x * (1 + x * ((real)(1.0 / 2) + x * ((real)(1.0 / 6) + x * ((real)(1.0 / 24) + x * ((real)(1.0 / 120)
           + x * ((real)(1.0 / 720) + x * ((real)(1.0 / 5040) + x * ((real)(1.0 / 40320) + x * ((real)(1.0 / 362880)
           + x * ((real)(1.0 / 3628800) + x * ((real)(1.0 / 39916800) + x * ((real)(1.0 / 479001600)
           + x * ((real)(1.0 / 6227020800.0) + x * ((real)(1.0 / 87178291200.0) + x * ((real)(1.0 / 1307674368000.0)
           + x * (real)(1.0 / 20922789888000.0))))))))))))))));
}

static void actuators(const tg_model *m, tg_work *w)
{
    const int A = m->actuated, C = m->cables;
    const real h = m->h;
    for (int a = 0; a < A; ++a) {
        const real decay = m->decay[a], tau = m->tau[a], v = m->max_speed[a];
        const real gain = m->gain[a], offset = m->offset[a];
        const real *act = ROW(w->act, a), *cmd = ROW(w->cmd, a);
        real *end = ROW(w->act_end, a), *used = ROW(w->act_used, a);
        const int mean = m->actuate_mean;
        /* t1: how long the step is speed-limited (0 mostly: the command is near) */
        real t1[LANES], d2[LANES];
        LANE_LOOP {
            const real size = FABS(act[l] - cmd[l]);
            const real t = (size - tau * v) / v;
            t1[l] = t < 0 ? (real)0 : (t > h ? h : t);
        }
        int limited = 0;
        for (int l = 0; l < LANES; ++l) limited |= t1[l] > 0;
        if (limited) {
            real arg[LANES];
            LANE_LOOP {
                arg[l] = -(h - t1[l]) / tau;
                d2[l] = t1[l] > 0 ? exp_series(arg[l] < EXP_SERIES_LIMIT ? EXP_SERIES_LIMIT : arg[l]) : decay;
            }
            for (int l = 0; l < LANES; ++l)             /* tau < 2 h: libm (rare) */
                if (t1[l] > 0 && arg[l] < EXP_SERIES_LIMIT) d2[l] = EXP(arg[l]);
        } else {
            LANE_LOOP d2[l] = decay;
        }
        LANE_LOOP {
            const real gap = act[l] - cmd[l];
            const real size = FABS(gap);
            const real sign = gap > 0 ? (real)1 : (gap < 0 ? (real)-1 : (real)0);
            const real knee = size - v * t1[l];
            end[l] = cmd[l] + sign * (knee * d2[l]);
            const real area = size * t1[l] - (real)0.5 * v * t1[l] * t1[l] + knee * tau * ((real)1 - d2[l]);
            const real source = mean ? cmd[l] + sign * (area / h) : act[l];
            used[l] = gain * source + offset;
        }
    }
    for (int c = 0; c < C; ++c) {
        const int a = m->cable_act[c];
        real *rest = ROW(w->rest, c);
        if (a >= 0) {
            const real *used = ROW(w->act_used, a);
            LANE_LOOP rest[l] = used[l];
        } else {
            const real value = m->passive_rest[c];
            LANE_LOOP rest[l] = value;
        }
    }
}

/* Command row `row` of every lane, clamped to the command range (clamp_command). */
static void load_commands(const tg_model *m, const tg_io *io, tg_work *w, idx_t row)
{
    const int A = m->actuated;
    for (int a = 0; a < A; ++a) {
        const real lo = m->command_low[a], hi = m->command_high[a];
        real *cmd = ROW(w->cmd, a);
        const real *src = io->commands + row * io->c_s + a * io->c_a;
        for (int l = 0; l < LANES; ++l) {
            const real c = src[w->sample[l] * io->c_b];
            const real below = c > hi ? hi : c;         /* NaN passes, as torch.minimum */
            cmd[l] = below < lo ? lo : below;
        }
    }
}

static void load_wrench(const tg_model *m, const tg_io *io, tg_work *w, idx_t step)
{
    const int R = m->rods;
    for (int k = 0; k < 6; ++k)
        for (int r = 0; r < R; ++r) {
            real *dst = ROW(w->wrench, k * R + r);
            const real *src = io->wrenches + step * io->w_s + r * io->w_r + k * io->w_k;
            for (int l = 0; l < LANES; ++l) dst[l] = src[w->sample[l] * io->w_b];
        }
}

/* The step's accelerations (acc, alpha) at the state st and the rest lengths rest: forces,
 * contacts, the ground (friction velocity-implicit over h, or the soft ground solved over
 * it), Newton-Euler or implicitfast's per-rod solve. */
static void derivatives(const tg_model *m, tg_work *w, int with_wrench)
{
    kinematics(m, w);
    cables(m, w);
    if (m->floor || m->pairs) nodes(m, w);
    if (m->floor && !m->soft_ground) ground(m, w);
    if (m->pairs && !m->soft_pairs && pair_geometry(m, w, 0)) pair_response(m, w);
    external(m, w, with_wrench);
    if ((m->floor && m->soft_ground) || m->soft_pairs) {
        accelerations(m, w);                      /* without the contacts */
        int coupled = 0;
        if (m->soft_pairs) {
            const real low = soft_power(m->soft_mid, m->soft_power - 1);
            const real high = soft_power(1 - m->soft_mid, m->soft_power - 1);
            coupled = soft_pairs_solve(m, w, low, high);
        }
        if (m->floor && m->soft_ground) soft_ground(m, w, !m->implicitfast, coupled ? w->pair_own : NULL);
        if (coupled) soft_pairs_write(m, w, !m->implicitfast);
        if (m->implicitfast) accelerations_implicit(m, w);
    } else {
        if (m->implicitfast) accelerations_implicit(m, w); else accelerations(m, w);
        if (m->floor) {
            ground_friction(m, w);
            if (m->implicitfast) accelerations_implicit(m, w); else accelerations(m, w);
        }
    }
}

/* rk4: st = st0's pose moved by the velocities `pose` [6][R] over hp (the orientation by the
 * exponential of the angular part over half_hp = hp / 2), with velocities `vel` [6][R]
 * (RigidRods.advance, then RungeKutta4._moved; fixed rods masked in both). */
static void rk4_place(const tg_model *m, tg_work *w, const real *pose, const real *vel, real hp, real half_hp)
{
    const int R = m->rods;
    const int fixed = m->has_fixed;
    for (int r = 0; r < R; ++r) {
        real *s[13];
        const real *s0[7];
        for (int k = 0; k < 13; ++k) s[k] = ROW(w->st, k * R + r);
        for (int k = 0; k < 7; ++k) s0[k] = ROW(w->st0, k * R + r);
        const real fr = m->free[r];
        real p[6][LANES];
        for (int k = 0; k < 6; ++k) {
            const real *src = ROW(pose, k * R + r), *nv = ROW(vel, k * R + r);
            real *dst = s[7 + k];
            LANE_LOOP {
                p[k][l] = fixed ? src[l] * fr : src[l];
                dst[l] = fixed ? nv[l] * fr : nv[l];
            }
        }
        LANE_LOOP {
            s[0][l] = s0[0][l] + hp * p[0][l]; s[1][l] = s0[1][l] + hp * p[1][l]; s[2][l] = s0[2][l] + hp * p[2][l];
        }
        const real *turn[3] = {p[3], p[4], p[5]};
        rotate(s + 3, s0 + 3, turn, half_hp);
    }
}

/* rk4: the next stage's velocities, st0's + c (acc, alpha), into `out` [6][R]. */
static void rk4_stage_velocity(const tg_model *m, tg_work *w, real c, real *out)
{
    const int R = m->rods;
    for (int k = 0; k < 6; ++k)
        for (int r = 0; r < R; ++r) {
            const real *v0 = ROW(w->st0, (7 + k) * R + r);
            const real *a = k < 3 ? ROW(w->acc, k * R + r) : ROW(w->alpha, (k - 3) * R + r);
            real *o = ROW(out, k * R + r);
            LANE_LOOP o[l] = v0[l] + c * a[l];
        }
}

/* Adds weight x (the stage's velocities in st, its accelerations) to rk_pose and rk_sum
 * (the first stage sets them), in the torch code's operand order. */
static void rk4_accumulate(const tg_model *m, tg_work *w, int first, real weight)
{
    const int R = m->rods;
    for (int k = 0; k < 6; ++k)
        for (int r = 0; r < R; ++r) {
            const real *v = ROW(w->st, (7 + k) * R + r);
            const real *a = k < 3 ? ROW(w->acc, k * R + r) : ROW(w->alpha, (k - 3) * R + r);
            real *ps = ROW(w->rk_pose, k * R + r), *as = ROW(w->rk_sum, k * R + r);
            if (first) {
                LANE_LOOP { ps[l] = v[l]; as[l] = a[l]; }
            } else if (weight == (real)1) {
                LANE_LOOP { ps[l] = ps[l] + v[l]; as[l] = as[l] + a[l]; }
            } else {
                LANE_LOOP { ps[l] = ps[l] + weight * v[l]; as[l] = as[l] + weight * a[l]; }
            }
        }
}

/* One classic Runge-Kutta step at the rest lengths `actuators` left (integrators.RungeKutta4):
 * stages at st0, st0 moved half a step by the stage velocities, and a whole step; the pose
 * moves by the stages' weighted velocities (the orientation with the Magnus term
 * h / 12 w_end x w0), the velocities by their weighted accelerations. */
static void rk4_step(const tg_model *m, tg_work *w, int with_wrench)
{
    const int R = m->rods;
    const real h = m->h, half_h = m->half_h, quarter_h = m->quarter_h;
    real *vel = w->rk_vel;
    memcpy(w->st0, w->st, sizeof(real) * 13 * R * LANES);
    derivatives(m, w, with_wrench);
    rk4_accumulate(m, w, 1, (real)1);
    rk4_stage_velocity(m, w, half_h, vel);
    rk4_place(m, w, ROW(w->st, 7 * R), vel, half_h, quarter_h);        /* pose by v1 over h / 2 */
    derivatives(m, w, with_wrench);
    rk4_accumulate(m, w, 0, (real)2);
    rk4_stage_velocity(m, w, half_h, vel);
    rk4_place(m, w, ROW(w->st, 7 * R), vel, half_h, quarter_h);        /* pose by v2 over h / 2 */
    derivatives(m, w, with_wrench);
    rk4_accumulate(m, w, 0, (real)2);
    rk4_stage_velocity(m, w, h, vel);
    rk4_place(m, w, ROW(w->st, 7 * R), vel, h, half_h);                /* pose by v3 over h */
    derivatives(m, w, with_wrench);
    rk4_accumulate(m, w, 0, (real)1);
    /* v_end = v0 + h * sum / 6; pose velocity sum / 6 (+ Magnus on the angular part) */
    for (int k = 0; k < 6; ++k)
        for (int r = 0; r < R; ++r) {
            const real *v0 = ROW(w->st0, (7 + k) * R + r);
            real *ps = ROW(w->rk_pose, k * R + r), *as = ROW(w->rk_sum, k * R + r);
            real *o = ROW(vel, k * R + r);
            LANE_LOOP {
                o[l] = v0[l] + h * as[l] / (real)6;
                ps[l] = ps[l] / (real)6;
            }
        }
    const real magnus = m->magnus;
    for (int r = 0; r < R; ++r) {
        const real *a0 = ROW(vel, 3 * R + r), *a1 = ROW(vel, 4 * R + r), *a2 = ROW(vel, 5 * R + r);
        const real *b0 = ROW(w->st0, 10 * R + r), *b1 = ROW(w->st0, 11 * R + r), *b2 = ROW(w->st0, 12 * R + r);
        real *p0 = ROW(w->rk_pose, 3 * R + r), *p1 = ROW(w->rk_pose, 4 * R + r), *p2 = ROW(w->rk_pose, 5 * R + r);
        LANE_LOOP {
            const real c0 = a1[l] * b2[l] - a2[l] * b1[l];
            const real c1 = a2[l] * b0[l] - a0[l] * b2[l];
            const real c2 = a0[l] * b1[l] - a1[l] * b0[l];
            p0[l] = p0[l] + magnus * c0; p1[l] = p1[l] + magnus * c1; p2[l] = p2[l] + magnus * c2;
        }
    }
    rk4_place(m, w, w->rk_pose, vel, h, half_h);
}

/* All steps of the samples first .. first + LANES - 1 (fewer at the end of the batch). */
static void run_chunk(const tg_model *m, const tg_io *io, tg_work *w, idx_t first)
{
    const int R = m->rods, A = m->actuated;
    const idx_t live = io->batch - first < LANES ? io->batch - first : LANES;
    for (int l = 0; l < LANES; ++l) w->sample[l] = first + (l < live ? l : live - 1);
    for (int k = 0; k < 13; ++k)
        for (int r = 0; r < R; ++r) {
            real *dst = ROW(w->st, k * R + r);
            for (int l = 0; l < LANES; ++l)
                dst[l] = io->state0[w->sample[l] * io->s0_b + r * io->s0_r + k * io->s0_k];
        }
    for (int a = 0; a < A; ++a) {
        real *dst = ROW(w->act, a);
        for (int l = 0; l < LANES; ++l) dst[l] = io->act0[w->sample[l] * io->a0_b + a * io->a0_a];
    }
    for (int r = 0; r < R; ++r) memset(ROW(w->soft_prev, 6 * R + r), 0, LANES * sizeof(real));
    if (m->soft_pairs) soft_pairs_none(m, w);
    for (idx_t step = 0; step < io->steps; ++step) {
        if (step % io->hold == 0) load_commands(m, io, w, step / io->hold);
        actuators(m, w);
        if (io->wrenches) load_wrench(m, io, w, step);
        if (m->rk4) {
            rk4_step(m, w, io->wrenches != NULL);
        } else {
            derivatives(m, w, io->wrenches != NULL);
            advance(m, w);
        }
        real *swap = w->act; w->act = w->act_end; w->act_end = swap;
        if ((step + 1) % io->record_every == 0) {
            const idx_t rec = (step + 1) / io->record_every - 1;
            for (idx_t l = 0; l < live; ++l) {
                real *out = io->states + (first + l) * io->o_b + rec * io->o_s;
                for (int r = 0; r < R; ++r)
                    for (int k = 0; k < 13; ++k) out[r * io->o_r + k * io->o_k] = ROW(w->st, k * R + r)[l];
                real *act_out = io->acts + (first + l) * io->oa_b + rec * io->oa_s;
                for (int a = 0; a < A; ++a) act_out[a * io->oa_a] = ROW(w->act, a)[l];
            }
        }
    }
}

static void work_free(tg_work *w)
{
    free(w->block);
    free(w->pair_slots);
    free(w->pair_own);
    free(w->pair_vec);
}

#ifdef TG_NARROW
/* This unit is the narrow build (LANES halved; the library links it beside the wide one):
 * it runs the chunks that the wide unit's schedule gives narrow lanes. Its work area is
 * opaque there, since tg_work's size depends on LANES. */
void *tg_narrow_work(const tg_model *m)
{
    tg_work *w = calloc(1, sizeof *w);
    if (w && work_alloc(w, m)) {
        work_free(w);
        free(w);
        w = NULL;
    }
    return w;
}

void tg_narrow_free(void *w)
{
    if (w) work_free((tg_work *)w);
    free(w);
}

void tg_narrow_chunk(const tg_model *m, const tg_io *io, void *w, idx_t first)
{
    run_chunk(m, io, (tg_work *)w, first);
}
#else
#if LANES % 2
#error "LANES must be even: the narrow unit runs LANES / 2"
#endif
#define NARROW (LANES / 2)
void *tg_narrow_work(const tg_model *m);
void tg_narrow_free(void *w);
void tg_narrow_chunk(const tg_model *m, const tg_io *io, void *w, idx_t first);

/* The chunks of a batch on `threads` threads: rounds of `threads` wide chunks (LANES
 * samples), then the rest of the batch. When the rest fits in one narrow chunk (LANES / 2
 * samples, the narrow unit) per thread, it runs as narrow chunks rather than fewer wide
 * ones that leave threads idle: a narrow chunk costs about 0.7 of a wide one (AVX2,
 * float32), so MPPI's 40 samples on 2 threads take 2 wide + 1 narrow chunk-times instead
 * of 3 wide, and 8 samples on 2 threads one narrow chunk each. Writes the threads used
 * (at most one per chunk), the wide chunks (from sample 0) and the narrow ones (from sample
 * out[3]; the batch's size when there are none) to out[0..3]. */
void tg_schedule(idx_t batch, int threads, idx_t out[4])
{
    const idx_t chunks = (batch + LANES - 1) / LANES, narrow_chunks = (batch + NARROW - 1) / NARROW;
    if (threads > narrow_chunks) threads = (int)narrow_chunks;
    if (threads < 1) threads = 1;
    const idx_t rounds_end = batch / ((idx_t)LANES * threads) * LANES * threads;
    const idx_t rest_chunks = (batch - rounds_end + NARROW - 1) / NARROW;
    const idx_t narrow = rest_chunks <= threads ? rest_chunks : 0;
    const idx_t wide = narrow ? rounds_end / LANES : chunks;
    const idx_t tasks = wide + narrow > 0 ? wide + narrow : 1;
    out[0] = threads < tasks ? threads : (int)tasks;                     /* no thread without a chunk */
    out[1] = wide;
    out[2] = narrow;
    out[3] = narrow ? rounds_end : batch;
}

/* Runs the rollout (see tg_schedule); returns 0, or -1 if a work area could not be
 * allocated. */
int tg_rollout(const tg_model *m, const tg_io *io, int threads)
{
    idx_t plan[4];
    tg_schedule(io->batch, threads, plan);
    threads = (int)plan[0];
    const idx_t wide = plan[1], narrow = plan[2], narrow_start = plan[3];
    tg_work *work = calloc((size_t)threads, sizeof *work);
    void **narrow_work = calloc((size_t)threads, sizeof *narrow_work);
    int failed = !work || !narrow_work;
    for (int t = 0; t < threads && !failed; ++t) {
        failed |= work_alloc(&work[t], m) != 0;
        if (narrow && !failed) failed |= (narrow_work[t] = tg_narrow_work(m)) == NULL;
    }
    if (!failed) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (idx_t task = 0; task < wide + narrow; ++task) {
#ifdef _OPENMP
            const int mine = omp_get_thread_num();
#else
            const int mine = 0;
#endif
            if (task < wide)
                run_chunk(m, io, &work[mine], task * LANES);
            else
                tg_narrow_chunk(m, io, narrow_work[mine], narrow_start + (task - wide) * NARROW);
        }
    }
    for (int t = 0; t < threads; ++t) {
        if (work) work_free(&work[t]);
        if (narrow_work) tg_narrow_free(narrow_work[t]);
    }
    free(work);
    free(narrow_work);
    return failed ? -1 : 0;
}

int tg_lanes(void) { return LANES; }
int tg_real_size(void) { return (int)sizeof(real); }
#endif
